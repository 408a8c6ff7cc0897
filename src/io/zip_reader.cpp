#include "io/zip_reader.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "sd/error.h"

namespace sd {

namespace {

// torch.save writes one record a tensor storage plus a few; a million is far
// past any checkpoint, and 64 MiB of directory far past a million names.
constexpr uint64_t kMaxRecords = 1u << 20;
constexpr uint64_t kMaxDirectory = 64u << 20;

uint64_t le(const char* p, int n) {
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = v << 8 | static_cast<unsigned char>(p[k]);
    return v;
}

}  // namespace

void read_at(int fd, uint64_t offset, uint64_t n, char* dst, const std::string& path) {
    while (n > 0) {
        const ssize_t got =
            ::pread(fd, dst, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)), static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw Error("cannot read " + path + ": " + std::strerror(errno));
        if (got == 0) throw Error("cannot read " + path + ": the file ends early (truncated?)");
        dst += got;
        offset += static_cast<uint64_t>(got);
        n -= static_cast<uint64_t>(got);
    }
}

ZipReader::ZipReader(int fd, uint64_t file_size, const std::string& path)
    : fd_(fd), file_size_(file_size), path_(path) {
    const auto bad = [&](const std::string& why) {
        return Error("cannot read " + path_ + ": not a valid zip archive of tensors (" + why + ")");
    };
    // The end-of-directory record is in the last 22 bytes plus a comment of at most 64 KiB.
    const uint64_t tail_size = std::min<uint64_t>(file_size, 22 + 65535 + 20);
    std::string tail(tail_size, '\0');
    read_at(fd, file_size - tail_size, tail_size, tail.data(), path);
    size_t eocd = std::string::npos;
    for (size_t k = tail_size >= 22 ? tail_size - 22 + 1 : 0; k-- > 0;)
        if (tail.compare(k, 4, "PK\x05\x06") == 0) {
            eocd = k;
            break;
        }
    if (eocd == std::string::npos) throw bad("no end of central directory");
    const char* e = tail.data() + eocd;
    uint64_t count = le(e + 10, 2), dir_size = le(e + 12, 4), dir_offset = le(e + 16, 4);
    if (eocd >= 20 && tail.compare(eocd - 20, 4, "PK\x06\x07") == 0) {  // ZIP64
        const uint64_t at = le(tail.data() + eocd - 20 + 8, 8);
        char z[56];
        if (at > file_size || file_size - at < sizeof z) throw bad("a ZIP64 directory record past the end");
        read_at(fd, at, sizeof z, z, path);
        if (std::memcmp(z, "PK\x06\x06", 4) != 0) throw bad("a damaged ZIP64 directory record");
        count = le(z + 32, 8);
        dir_size = le(z + 40, 8);
        dir_offset = le(z + 48, 8);
    }
    if (count > kMaxRecords) throw bad("more than " + std::to_string(kMaxRecords) + " records");
    if (dir_size > kMaxDirectory || dir_offset > file_size || dir_size > file_size - dir_offset)
        throw bad("a central directory past the end of the file");
    std::string dir(dir_size, '\0');
    read_at(fd, dir_offset, dir_size, dir.data(), path);
    size_t p = 0;
    for (uint64_t k = 0; k < count; ++k) {
        if (dir_size - p < 46 || dir.compare(p, 4, "PK\x01\x02") != 0) throw bad("a damaged central directory");
        const char* c = dir.data() + p;
        const uint64_t flags = le(c + 8, 2), name_len = le(c + 28, 2), extra_len = le(c + 30, 2),
                       comment_len = le(c + 32, 2);
        if (dir_size - p - 46 < name_len + extra_len + comment_len) throw bad("a damaged central directory");
        ZipRecord r;
        r.method = static_cast<uint16_t>(le(c + 10, 2));
        r.compressed_size = le(c + 20, 4);
        r.size = le(c + 24, 4);
        r.header_offset = le(c + 42, 4);
        r.name.assign(c + 46, name_len);
        // ZIP64 sizes: in the extra field, in this order, each only when its 32-bit field is all ones.
        for (size_t x = 46 + name_len; x + 4 <= 46 + name_len + extra_len;) {
            const uint64_t id = le(c + x, 2), len = le(c + x + 2, 2);
            if (x + 4 + len > 46 + name_len + extra_len) throw bad("a damaged extra field");
            if (id == 1) {
                size_t f = x + 4;
                for (uint64_t* v : {&r.size, &r.compressed_size, &r.header_offset}) {
                    if (*v != 0xffffffffu) continue;
                    if (f + 8 > x + 4 + len) throw bad("a damaged ZIP64 field");
                    *v = le(c + f, 8);
                    f += 8;
                }
            }
            x += 4 + len;
        }
        if (flags & 1) throw bad("an encrypted record");
        if (r.method != 0 && r.method != 8) throw bad("a record compressed with method " + std::to_string(r.method));
        if (r.header_offset > file_size || r.compressed_size > file_size - r.header_offset)
            throw bad("a record past the end of the file");
        if (r.method == 0 && r.size != r.compressed_size) throw bad("a stored record whose sizes differ");
        records_.push_back(std::move(r));
        p += 46 + name_len + extra_len + comment_len;
    }
}

const ZipRecord* ZipReader::find(const std::string& name) const {
    for (const auto& r : records_) {
        const size_t slash = r.name.find('/');
        if (slash != std::string::npos && r.name.compare(slash + 1, std::string::npos, name) == 0) return &r;
    }
    return nullptr;
}

void ZipReader::read(const ZipRecord& r, uint64_t n, char* dst) const {
    const auto bad = [&](const std::string& why) {
        return Error("cannot read " + path_ + ": not a valid zip archive of tensors (" + r.name + ": " + why + ")");
    };
    if (n > r.size) throw bad("shorter than its tensors");
    char local[30];
    read_at(fd_, r.header_offset, sizeof local, local, path_);
    if (std::memcmp(local, "PK\x03\x04", 4) != 0) throw bad("a damaged local header");
    const uint64_t data = r.header_offset + 30 + le(local + 26, 2) + le(local + 28, 2);
    if (data > file_size_ || r.compressed_size > file_size_ - data) throw bad("data past the end of the file");
    if (r.method == 0) return read_at(fd_, data, n, dst, path_);
    // Deflated: inflate until n bytes came out, never more; the input is bounded by the compressed size.
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw Error("cannot read " + path_ + ": out of memory (zlib)");
    std::string in(64u << 10, '\0');
    uint64_t in_at = data, in_left = r.compressed_size, out_done = 0;
    int rc = Z_OK;
    while (out_done < n) {
        if (z.avail_in == 0) {
            if (in_left == 0) break;
            const uint64_t k = std::min<uint64_t>(in_left, in.size());
            try {
                read_at(fd_, in_at, k, in.data(), path_);
            } catch (...) {
                inflateEnd(&z);
                throw;
            }
            in_at += k;
            in_left -= k;
            z.next_in = reinterpret_cast<Bytef*>(in.data());
            z.avail_in = static_cast<uInt>(k);
        }
        const uint64_t want = std::min<uint64_t>(n - out_done, 1u << 30);
        z.next_out = reinterpret_cast<Bytef*>(dst + out_done);
        z.avail_out = static_cast<uInt>(want);
        rc = inflate(&z, Z_NO_FLUSH);
        out_done += want - z.avail_out;
        if (rc == Z_STREAM_END) break;
        if (rc != Z_OK && rc != Z_BUF_ERROR) break;
        if (rc == Z_BUF_ERROR && z.avail_in > 0) break;  // no progress possible
    }
    inflateEnd(&z);
    if (out_done < n) throw bad(rc == Z_MEM_ERROR ? "out of memory while inflating" : "damaged compressed data");
}

}  // namespace sd
