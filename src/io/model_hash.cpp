#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "sd/error.h"
#include "sd/model_hash.h"

namespace sd {

namespace {

// A 64-bit multiply-xor hash taken 8 bytes at a time, so that a folder of
// gigabytes hashes at memory speed; not cryptographic, only an identity.
struct Hash64 {
    uint64_t h = 0x6a09e667f3bcc908ull;
    void word(uint64_t w) {
        h ^= w;
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    void bytes(const char* p, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            word(w);
        }
        uint64_t tail = 0;
        std::memcpy(&tail, p + i, n - i);
        word(tail ^ (static_cast<uint64_t>(n - i) << 56));
    }
};

}  // namespace

std::string model_folder_hash(const std::string& model_dir) {
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(model_dir, ec))
        if (e.is_regular_file()) files.push_back(e.path());
    if (ec) throw Error("cannot read model folder " + model_dir + ": " + ec.message());
    std::sort(files.begin(), files.end());
    Hash64 hash;
    std::vector<char> buf(1 << 20);
    for (const auto& f : files) {
        const std::string name = f.filename().string();
        hash.bytes(name.data(), name.size());
        std::ifstream in(f, std::ios::binary);
        if (!in) throw Error("cannot read " + f.string());
        uint64_t total = 0;
        while (in) {
            in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
            const size_t n = static_cast<size_t>(in.gcount());
            if (n == 0) break;
            hash.bytes(buf.data(), n);  // 1 MiB blocks: a multiple of 8, so the blocks join up
            total += n;
        }
        hash.word(total);
    }
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash.h));
    return out;
}

}  // namespace sd
