// PNG text chunks. stb_image_write writes none, so the generation settings are
// added to the encoded bytes afterwards as an iTXt chunk (UTF-8, uncompressed),
// the way AUTOMATIC1111 stores its "parameters" text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sd {

// CRC-32 as PNG defines it (over chunk type and data).
uint32_t png_crc32(const uint8_t* data, size_t size, uint32_t crc = 0);

// Returns png with an iTXt chunk keyword=text inserted right after IHDR, so that
// readers that stop at the image data still see it. keyword: 1-79 Latin-1
// characters; text: UTF-8 without NUL. Throws sd::Error on a malformed PNG.
std::vector<uint8_t> png_add_itxt(const std::vector<uint8_t>& png, const std::string& keyword, const std::string& text);

// The uncompressed tEXt and iTXt chunks of a PNG, keyword -> text (for tests and tools).
// Throws sd::Error when the bytes are not a well-formed PNG or a CRC is wrong.
std::map<std::string, std::string> png_read_text(const std::vector<uint8_t>& png);

}  // namespace sd
