#include "engine/addon_weights.h"

#include "engine/tensor_file.h"
#include "io/fs_util.h"
#include "sd/error.h"

namespace sd {

// read_tensor_file (tensor_file.h) does the reading and its checks; add-ons
// use only floating tensors (a checkpoint's int64 position_ids are left out).
NamedTensors read_addon_weights(const std::string& path, const std::string& what) {
    if (!file_exists(path) || is_directory(path)) throw Error(what + ": no such file " + path);
    NamedTensors out;
    for (auto& [name, t] : read_tensor_file(path))
        if (t.is_floating_point()) out.emplace_back(name, t.to(at::kFloat));
    return out;
}

}  // namespace sd
