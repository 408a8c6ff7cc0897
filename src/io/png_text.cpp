#include "io/png_text.h"

#include <array>
#include <cstdio>
#include <cstring>

#include "sd/error.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

uint32_t read_be32(const uint8_t* p) {
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

struct Chunk {
    size_t offset;  // of the length field
    uint32_t length;
    std::string type;
    const uint8_t* data;
};

// Bytes of a file shown in a message: letters, digits and punctuation as they
// are, anything else as \xNN, so that a crafted chunk cannot put control codes on the terminal.
std::string printable(const std::string& bytes) {
    std::string out;
    for (unsigned char c : bytes) {
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += static_cast<char>(c);
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

// Walks the chunks, checking lengths and CRCs; stops after IEND.
std::vector<Chunk> chunks_of(const uint8_t* png, size_t size) {
    if (size < 8 || std::memcmp(png, kSignature, 8) != 0) throw Error("not a PNG file");
    std::vector<Chunk> chunks;
    size_t pos = 8;
    while (pos + 12 <= size) {
        const uint32_t len = read_be32(&png[pos]);
        if (len > size - pos - 12) throw Error("truncated PNG chunk");
        Chunk c{pos, len, std::string(reinterpret_cast<const char*>(&png[pos + 4]), 4), &png[pos + 8]};
        const uint32_t crc = read_be32(&png[pos + 8 + len]);
        if (png_crc32(&png[pos + 4], len + 4) != crc) throw Error("bad CRC in PNG chunk " + printable(c.type));
        chunks.push_back(c);
        pos += 12 + len;
        if (c.type == "IEND") return chunks;
    }
    throw Error("PNG without IEND");
}

}  // namespace

uint32_t png_crc32(const uint8_t* data, size_t size, uint32_t crc) {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t n = 0; n < 256; ++n) {
            uint32_t c = n;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
            t[n] = c;
        }
        return t;
    }();
    crc = ~crc;
    for (size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

std::vector<uint8_t> png_add_itxt(const std::vector<uint8_t>& png, const std::string& keyword,
                                  const std::string& text) {
    if (keyword.empty() || keyword.size() > 79 || keyword.find('\0') != std::string::npos)
        throw Error("PNG text keyword must be 1-79 characters");
    if (text.find('\0') != std::string::npos) throw Error("PNG text must not contain NUL");
    if (!is_valid_utf8(text)) throw Error("PNG iTXt text must be valid UTF-8");
    const auto chunks = chunks_of(png.data(), png.size());
    if (chunks.empty() || chunks[0].type != "IHDR") throw Error("PNG does not start with IHDR");

    // iTXt data: keyword, NUL, compression flag 0, method 0, empty language tag
    // and translated keyword (each NUL-terminated), then the UTF-8 text.
    std::vector<uint8_t> chunk;
    put_be32(chunk, 0);  // length, filled in below
    for (char ch : std::string("iTXt") + keyword) chunk.push_back(static_cast<uint8_t>(ch));
    for (uint8_t b : {0, 0, 0, 0, 0}) chunk.push_back(b);
    chunk.insert(chunk.end(), text.begin(), text.end());
    const uint32_t len = static_cast<uint32_t>(chunk.size() - 8);
    for (int i = 0; i < 4; ++i) chunk[i] = static_cast<uint8_t>(len >> (24 - 8 * i));
    put_be32(chunk, png_crc32(chunk.data() + 4, chunk.size() - 4));

    const size_t after_ihdr = chunks[0].offset + 12 + chunks[0].length;
    std::vector<uint8_t> out(png.begin(), png.begin() + static_cast<long>(after_ihdr));
    out.insert(out.end(), chunk.begin(), chunk.end());
    out.insert(out.end(), png.begin() + static_cast<long>(after_ihdr), png.end());
    return out;
}

std::string latin1_to_utf8(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (unsigned char c : text) {
        if (c < 0x80) {
            out += static_cast<char>(c);
        } else {
            out += static_cast<char>(0xc0 | (c >> 6));
            out += static_cast<char>(0x80 | (c & 0x3f));
        }
    }
    return out;
}

std::map<std::string, std::string> png_read_text(const uint8_t* png, size_t size, const PngTextLimits& limits) {
    std::map<std::string, std::string> texts;
    size_t total = 0;
    for (const auto& c : chunks_of(png, size)) {
        if (c.type != "tEXt" && c.type != "iTXt") continue;
        const std::string data(reinterpret_cast<const char*>(c.data), c.length);
        const size_t key_end = data.find('\0');
        if (key_end == std::string::npos || key_end == 0 || key_end > 79) throw Error("malformed PNG text chunk");
        const std::string key = data.substr(0, key_end);
        std::string text;
        if (c.type == "tEXt") {
            text = data.substr(key_end + 1);
        } else {
            // iTXt: flag, method, language\0, translated keyword\0, text.
            if (key_end + 3 > data.size()) throw Error("malformed iTXt chunk");
            if (data[key_end + 1] != 0) continue;  // compressed: not needed here
            const size_t lang_end = data.find('\0', key_end + 3);
            const size_t tkey_end = lang_end == std::string::npos ? lang_end : data.find('\0', lang_end + 1);
            if (tkey_end == std::string::npos) throw Error("malformed iTXt chunk");
            text = data.substr(tkey_end + 1);
        }
        if (text.size() > limits.per_chunk)
            throw Error("text chunk \"" + printable(key) + "\" holds " + std::to_string(text.size()) +
                        " bytes; the limit is " + std::to_string(limits.per_chunk));
        total += text.size();
        if (total > limits.total) throw Error("text chunks hold more than " + std::to_string(limits.total) + " bytes");
        if (c.type == "tEXt") {
            texts[key] = latin1_to_utf8(text);
        } else {
            if (!is_valid_utf8(text)) throw Error("iTXt chunk \"" + printable(key) + "\" is not valid UTF-8");
            texts[key] = std::move(text);
        }
    }
    return texts;
}

std::map<std::string, std::string> png_read_text(const std::vector<uint8_t>& png, const PngTextLimits& limits) {
    return png_read_text(png.data(), png.size(), limits);
}

}  // namespace sd
