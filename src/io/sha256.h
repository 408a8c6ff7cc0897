// SHA-256 (FIPS 180-4), for the short hashes AUTOMATIC1111 writes in PNG text
// ("Lora hashes", "TI hashes").
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sd {

class Sha256 {
public:
    Sha256();
    void update(const void* data, size_t size);
    std::string hex();  // finishes the hash: call once

private:
    void block(const unsigned char* p);
    uint32_t h_[8];
    unsigned char buf_[64];
    size_t used_ = 0;
    uint64_t length_ = 0;
};

// Lower-case hex digest of the bytes.
std::string sha256_hex(const std::string& bytes);

// The digest of a file's bytes, read in blocks. Throws sd::Error naming the
// file if it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace sd
