// The pickle inside a torch.save zip archive (.pt, .pth, .ckpt, .bin): which
// tensors it holds and where their bytes are. Such files are pickles, and a
// pickle can call any Python function on load; this reader calls none. It
// knows the handful of opcodes torch.save writes and rebuilds only dicts,
// lists, tuples, scalars and tensors; any other global (a class, a function)
// is refused by name. The bytes themselves are read by src/engine/tensor_file.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sd {

struct PickledTensor {
    std::string name;           // dict keys (and list indices) from the top, joined with '.'
    std::string storage;        // the archive record under data/ that holds its bytes
    std::string dtype;          // a safetensors dtype name (io/weight_file.h dtype_size)
    int64_t storage_numel = 0;  // elements the storage holds, as the pickle says
    int64_t offset = 0;         // in elements
    std::vector<int64_t> shape, stride;
};

// Parses data.pkl of a torch.save archive. Throws sd::Error with a line naming
// `path` and the fault (an unknown global, a truncated or malformed pickle, a
// tensor that does not fit its storage as the pickle describes it).
std::vector<PickledTensor> parse_torch_pickle(std::string_view pickle, const std::string& path);

}  // namespace sd
