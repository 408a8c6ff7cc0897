// The records of a zip archive, torch.save's container (.pt, .pth, .ckpt,
// .bin), read from a file already open. No LibTorch. Every size comes from
// the file and is checked before anything is allocated: the central
// directory against the file, a record's declared size against what the
// caller asks for, and inflating stops at the bytes asked for, so a small
// deflated record cannot expand into gigabytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

struct ZipRecord {
    std::string name;            // as stored, e.g. "archive/data.pkl"
    uint64_t header_offset = 0;  // of its local header
    uint64_t compressed_size = 0;
    uint64_t size = 0;    // uncompressed, as the central directory says
    uint16_t method = 0;  // 0 stored, 8 deflated
};

class ZipReader {
public:
    // Reads the central directory of the open file `fd` of `file_size` bytes.
    // Throws sd::Error naming `path` when it is not a zip archive this reader takes.
    ZipReader(int fd, uint64_t file_size, const std::string& path);

    const std::vector<ZipRecord>& records() const { return records_; }

    // The record whose name, less its first folder ("archive/"), is `name`; null if none.
    const ZipRecord* find(const std::string& name) const;

    // The first n bytes of the record into dst (n at most its size). Throws sd::Error.
    void read(const ZipRecord& r, uint64_t n, char* dst) const;

private:
    int fd_;
    uint64_t file_size_;
    std::string path_;
    std::vector<ZipRecord> records_;
};

// Reads n bytes at offset of fd into dst; throws sd::Error naming path when the file ends early.
void read_at(int fd, uint64_t offset, uint64_t n, char* dst, const std::string& path);

}  // namespace sd
