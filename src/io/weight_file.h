// The index of a stage's weight file. An exported stage keeps its parameters
// beside its TorchScript file, in STAGE.weights (the safetensors layout), so
// that they can be mapped from the page cache instead of being copied into
// fresh memory (docs/model-format.md). This part only reads and checks the
// header; model.cpp maps the tensors.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

struct WeightEntry {
    std::string name;
    std::string dtype;            // "F32", "F16" or "BF16"
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range in the file (not in the data section)
};

// Reads and checks the header of a safetensors file: every entry's range lies
// inside the file, matches its shape and dtype and is aligned for its element
// type. Throws sd::Error naming the file and the fault; never trusts a size.
std::vector<WeightEntry> read_weight_index(const std::string& path);

// The same reading and checks on a whole file already in memory (the fuzz
// harness and its replay test call this); `path` names it in messages.
std::vector<WeightEntry> parse_weight_index(const std::string& file_bytes, const std::string& path);

// Where a stage's weights live: "dir/unet.pt" -> "dir/unet.weights".
std::string weight_file_for(const std::string& stage_path);

}  // namespace sd
