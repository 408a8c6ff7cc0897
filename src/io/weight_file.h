// The index of a stage's weight file. An exported stage keeps its parameters
// beside its TorchScript file, in STAGE.weights (the safetensors layout), so
// that they can be mapped from the page cache instead of being copied into
// fresh memory (docs/model-format.md). This part only reads and checks the
// header; engine/stage_loader.cpp maps the tensors.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sd {

struct WeightEntry {
    std::string name;
    std::string dtype;  // "F32", "F16", "BF16" or "I8" (any dtype_size name for WeightUse::AnyDtype)
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range in the file (not in the data section)
};

// Reads and checks the header of a safetensors file: every entry's range lies
// inside the file, matches its shape and dtype and is aligned for its element
// type. Throws sd::Error naming the file and the fault; never trusts a size.
// A model's own weights are mapped, so they must be floats aligned to their
// size, or a --dtype q8_0 export's 8-bit layers: an I8 `L.weight` only with its
// F16 `L.weight_scale` [rows, row / 32] (docs/model-format.md); a file that is
// copied (a LoRA, an embedding, a VAE: AnyDtype) may hold any safetensors dtype
// at any offset.
enum class WeightUse { Mapped, AnyDtype };
std::vector<WeightEntry> read_weight_index(const std::string& path, WeightUse use = WeightUse::Mapped);

// The same reading and checks on a whole file already in memory (the fuzz
// harness and its replay test call this); `path` names it in messages.
std::vector<WeightEntry> parse_weight_index(const std::string& file_bytes, const std::string& path,
                                            WeightUse use = WeightUse::Mapped);

// The checks of read_weight_index on a header's JSON text alone, for a file
// of file_size bytes (io/tensor_reader.h reads the header itself).
std::vector<WeightEntry> parse_weight_header(const std::string& header, uint64_t file_size, const std::string& path,
                                             WeightUse use);

// Bytes of one element of a safetensors dtype ("F64", "F32", "F16", "BF16",
// "I64", "I32", "I16", "I8", "U8", "BOOL"); 0 for any other name.
int dtype_size(const std::string& dtype);

// A safetensors file's "__metadata__": its string entries (none when it has none).
// The header is read with read_weight_index's bounds; throws sd::Error as it does
// for a file whose header cannot be read or is not a JSON object.
std::map<std::string, std::string> read_weight_metadata(const std::string& path);

// "[320,4,3,3]": a shape as the one-line errors about weight files print it.
std::string shape_text(const std::vector<int64_t>& shape);

// Where a stage's weights live: "dir/unet.pt" -> "dir/unet.weights".
std::string weight_file_for(const std::string& stage_path);

}  // namespace sd
