#include "engine/addon_weights.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "io/fs_util.h"
#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

at::ScalarType dtype_named(const std::string& name) {
    return name == "F32" ? at::kFloat : name == "F16" ? at::kHalf : at::kBFloat16;
}

// The index check (io/weight_file.h) has already bounded every range by the
// file's size, so the copies below read only what is there.
NamedTensors read_safetensors(const std::string& path) {
    const auto index = read_weight_index(path);
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    NamedTensors out;
    for (const auto& e : index) {
        if (e.end > bytes.size()) throw Error("weights file " + path + " is corrupt: it changed while being read");
        auto t = at::empty(e.shape, at::TensorOptions().dtype(dtype_named(e.dtype)));
        std::memcpy(t.data_ptr(), bytes.data() + e.begin, e.end - e.begin);
        out.emplace_back(e.name, t.to(at::kFloat));
    }
    return out;
}

}  // namespace

NamedTensors read_addon_weights(const std::string& path, const std::string& what) {
    if (!file_exists(path) || is_directory(path)) throw Error(what + ": no such file " + path);
    if (ends_with(path, ".safetensors")) return read_safetensors(path);
    throw Error(what + ": cannot read " + path + ": only .safetensors files are supported so far");
}

}  // namespace sd
