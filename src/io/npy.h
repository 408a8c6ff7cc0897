// Minimal reader and writer of numpy .npy files (version 1/2, little-endian,
// C order): float32, int64, int32, uint8. Used for --save-latents and tests.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

struct NpyArray {
    std::string dtype;  // numpy descr: "<f4", "<i8", "<i4", "|u1"
    std::vector<int64_t> shape;
    std::vector<char> data;  // raw little-endian bytes, C order

    int64_t numel() const;
    size_t item_size() const;
    template <class T>
    const T* as() const {
        return reinterpret_cast<const T*>(data.data());
    }
};

// Throws sd::Error naming the file on any problem (missing, truncated, unsupported).
NpyArray read_npy(const std::string& path);

// Writes atomically (temporary name, then link) and never replaces anything:
// throws sd::Error when path exists, or on any other failure.
void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
               size_t bytes);

}  // namespace sd
