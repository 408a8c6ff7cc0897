// One reader for the tensor files users download beside a model: LoRAs,
// textual-inversion embeddings, TAESD decoders, standalone VAEs. No LibTorch:
// it gives names, dtypes, shapes and bytes; the engine makes tensors of them
// (src/engine/tensor_file.h).
//
// A file is opened once: the header (a .safetensors header, or the pickle of
// a torch.save zip archive .pt/.pth/.ckpt/.bin, read by io/torch_pickle.h
// without running it), the TorchScript check, the SHA-256 when asked for
// (A1111's LoRA and TI hashes) and later the tensors asked for all come from
// that one open file. Memory is bounded before it is taken: the tensors read
// together, each storage counted once at its declared size plus every tensor
// at the size it materialises, must fit the caller's limit.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/torch_pickle.h"
#include "io/weight_file.h"

namespace sd {

class ZipReader;

struct TensorEntry {
    std::string name;   // safetensors key, or dict keys joined with '.' ("string_to_param.*")
    std::string dtype;  // a safetensors dtype name (io/weight_file.h dtype_size)
    std::vector<int64_t> shape;
    uint64_t bytes = 0;  // contiguous, as read()
};

struct TensorReadOptions {
    std::string what;                        // the file's role in messages: "LoRA file", "--vae", ...
    uint64_t max_bytes = uint64_t{1} << 30;  // memory one read() may take (see above)
    bool hash = false;                       // compute the SHA-256s while opening
    bool safetensors_only = false;           // read any file as .safetensors (LoRAs)
};

class TensorReader {
public:
    // Opens and checks the file (check_regular_file first, so a FIFO or a
    // device is refused, not read). Throws sd::Error with one line naming the
    // file: missing, not a regular file, truncated, corrupt, a TorchScript
    // program, torch.save's pre-1.6 format, a pickle that needs more than
    // tensors in dicts and lists, or out of memory.
    TensorReader(const std::string& path, TensorReadOptions options);
    ~TensorReader();
    TensorReader(const TensorReader&) = delete;
    TensorReader& operator=(const TensorReader&) = delete;

    const std::string& path() const { return path_; }
    bool is_safetensors() const { return safetensors_; }
    const std::vector<TensorEntry>& tensors() const { return entries_; }
    // A .safetensors file's header as read_weight_index gives it (byte ranges
    // in the file), in the order of tensors(); empty for a torch.save archive.
    const std::vector<WeightEntry>& safetensors_index() const { return ranges_; }
    // Index of the tensor of that name in tensors(), or -1.
    long find(const std::string& name) const;

    // Reads the tensors of these indexes, each into dest(index), which gives
    // room for tensors()[index].bytes bytes. Their memory (above) is checked
    // against max_bytes before anything is allocated. Throws sd::Error.
    void read(const std::vector<size_t>& which, const std::function<char*(size_t)>& dest);

    // Lower-case hex SHA-256 (with options.hash): of the whole file, and of a
    // .safetensors file's data after its header (A1111's "Lora hashes").
    const std::string& sha256() const { return sha256_; }
    const std::string& data_sha256() const { return data_sha256_; }

private:
    void open_safetensors();
    void open_torch_zip();
    void hash_file(uint64_t data_start);
    [[noreturn]] void out_of_memory() const;

    std::string path_;
    TensorReadOptions options_;
    int fd_ = -1;
    uint64_t size_ = 0;
    bool safetensors_ = false;
    std::vector<TensorEntry> entries_;
    std::vector<WeightEntry> ranges_;     // .safetensors: byte ranges, by index
    std::vector<PickledTensor> pickled_;  // torch.save: storages and views, by index
    std::unique_ptr<ZipReader> zip_;
    std::string sha256_, data_sha256_;
};

}  // namespace sd
