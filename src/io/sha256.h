// SHA-256 of a file, for the short hashes AUTOMATIC1111 records in PNG text
// ("TI hashes": the first 10 hex digits of a file's SHA-256).
#pragma once
#include <string>

namespace sd {

// Lower-case hex digest of the bytes.
std::string sha256_hex(const std::string& bytes);

// The digest of a file's bytes. Throws sd::Error naming the file if it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace sd
