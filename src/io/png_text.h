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
// characters; text: UTF-8 without NUL. Throws sd::Error on a malformed PNG or such a text.
std::vector<uint8_t> png_add_itxt(const std::vector<uint8_t>& png, const std::string& keyword, const std::string& text);

// Bounds on what png_read_text keeps, so that a crafted file cannot make it copy
// much: a text chunk longer than per_chunk bytes, or more than total bytes over
// all of them, is refused.
struct PngTextLimits {
    size_t per_chunk = 1 << 20;
    size_t total = 4 << 20;
};

// The uncompressed tEXt and iTXt chunks of a PNG, keyword (as stored) -> text, in UTF-8:
// tEXt is Latin-1 as the PNG standard says (how PIL and AUTOMATIC1111 store
// "café") and is converted; iTXt must be valid UTF-8. Throws sd::Error when the
// bytes are not a well-formed PNG, a CRC is wrong, an iTXt is not UTF-8 or a limit is passed.
std::map<std::string, std::string> png_read_text(const uint8_t* png, size_t size, const PngTextLimits& limits = {});
std::map<std::string, std::string> png_read_text(const std::vector<uint8_t>& png, const PngTextLimits& limits = {});

// Latin-1 bytes as UTF-8 (every byte is one code point).
std::string latin1_to_utf8(const std::string& text);

}  // namespace sd
