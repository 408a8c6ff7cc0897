#include "io/image_reader.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "io/fs_util.h"
#include "io/stb_image_impl.h"
#include "sd/error.h"

namespace sd {

namespace {

enum class Format { Unknown, Png, Jpeg, Bmp };

Format sniff(std::string_view b) {
    if (b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0) return Format::Png;
    if (b.size() >= 3 && std::memcmp(b.data(), "\xff\xd8\xff", 3) == 0) return Format::Jpeg;
    if (b.size() >= 2 && b[0] == 'B' && b[1] == 'M') return Format::Bmp;
    return Format::Unknown;
}

const char* format_name(Format f) {
    switch (f) {
        case Format::Png:
            return "PNG";
        case Format::Jpeg:
            return "JPEG";
        case Format::Bmp:
            return "BMP";
        default:
            return "picture";
    }
}

uint32_t le32(std::string_view b, size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
    return v;
}

uint16_t le16(std::string_view b, size_t at) {
    return static_cast<uint16_t>(static_cast<unsigned char>(b[at]) | (static_cast<unsigned char>(b[at + 1]) << 8));
}

// stb_image reads past the end of a BMP as zeros (a black band, no error); PNG
// and JPEG it refuses itself (missing zlib data, missing end marker). A BMP
// whose uncompressed rows do not fit in the file is refused here. Returns the
// bytes its rows need, 0 when the header is one stb_image checks itself
// (compressed, unusual) or refuses.
uint64_t bmp_bytes_needed(std::string_view b) {
    if (b.size() < 30) return 0;
    const uint64_t offset = le32(b, 10);
    const uint32_t header = le32(b, 14);
    int64_t w = 0, h = 0;
    uint32_t bpp = 0, compression = 0;
    if (header == 12) {
        w = le16(b, 18);
        h = le16(b, 20);
        bpp = le16(b, 24);
    } else {
        if (b.size() < 34) return 0;
        w = static_cast<int32_t>(le32(b, 18));
        h = static_cast<int32_t>(le32(b, 22));
        bpp = le16(b, 28);
        compression = le32(b, 30);
    }
    if (compression != 0 && compression != 3 && compression != 6) return 0;  // RLE: stb_image refuses
    if (w <= 0 || bpp == 0 || bpp > 32) return 0;
    const uint64_t rows = static_cast<uint64_t>(h < 0 ? -h : h);
    const uint64_t row_bytes = (static_cast<uint64_t>(w) * bpp + 31) / 32 * 4;
    return offset + row_bytes * rows;
}

uint32_t be32(std::string_view b, size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
    return v;
}

uint16_t be16(std::string_view b, size_t at) {
    return static_cast<uint16_t>((static_cast<unsigned char>(b[at]) << 8) | static_cast<unsigned char>(b[at + 1]));
}

// The Orientation entry (tag 0x0112, one SHORT) of a TIFF structure's first IFD,
// as EXIF stores it: 1 to 8, or 0 where there is none or the structure is damaged.
int tiff_orientation(std::string_view t) {
    if (t.size() < 8) return 0;
    const bool little = t[0] == 'I' && t[1] == 'I';
    if (!little && !(t[0] == 'M' && t[1] == 'M')) return 0;
    auto u16 = [&](uint64_t at) -> uint32_t { return little ? le16(t, at) : be16(t, at); };
    auto u32 = [&](uint64_t at) -> uint64_t { return little ? le32(t, at) : be32(t, at); };
    if (u16(2) != 42) return 0;
    const uint64_t ifd = u32(4);
    if (ifd + 2 > t.size()) return 0;
    const uint32_t entries = u16(ifd);
    for (uint32_t i = 0; i < entries; ++i) {
        const uint64_t e = ifd + 2 + 12ull * i;
        if (e + 12 > t.size()) return 0;
        if (u16(e) != 0x0112) continue;
        if (u16(e + 2) != 3 || u32(e + 4) != 1) return 0;
        const uint32_t v = u16(e + 8);
        return v >= 1 && v <= 8 ? static_cast<int>(v) : 0;
    }
    return 0;
}

// Two things stb_image (2.27) gets wrong in PNG files, put right before it
// reads one (it does not check chunk CRCs, so chunks can be rewritten):
//  - it keeps the palette in an uninitialised array: a pixel whose index is
//    past the PLTE chunk's entries takes whatever was on the stack. PIL gives
//    such an index i the grey (i, i, i); a short PLTE is padded to 256 entries
//    that way;
//  - an empty IDAT chunk before any data makes it memcpy to a null pointer
//    (undefined behaviour; found by the image_reader fuzz harness): empty IDAT
//    chunks are dropped (they hold nothing).
// Returns "" when nothing needs changing; malformed chunks are left for
// stb_image to report.
std::string png_for_stb(std::string_view b) {
    std::string out;
    bool changed = false, palette_image = false;
    size_t at = 8, copied = 0;  // b[copied, at) is still to be copied
    auto flush = [&](size_t upto) {
        out.append(b.substr(copied, upto - copied));
        copied = upto;
    };
    while (at + 8 <= b.size()) {
        const uint32_t len = be32(b, at);
        const std::string_view type = b.substr(at + 4, 4);
        if (type == "IDAT" && len == 0) {
            // Dropped even where the file ends inside its CRC: stb_image takes the
            // chunk before it finds the file short.
            flush(at);
            at = copied = std::min(b.size(), at + 12);
            changed = true;
            continue;
        }
        if (b.size() - at < 12 || len > b.size() - at - 12) break;
        const size_t next = at + 12 + static_cast<size_t>(len);
        if (type == "IHDR" && len >= 13) palette_image = static_cast<unsigned char>(b[at + 8 + 9]) == 3;
        if (type == "PLTE" && palette_image && len % 3 == 0 && len < 768) {
            flush(at);
            std::string data(b.substr(at + 8, len));
            for (size_t i = len / 3; i < 256; ++i) data.append(3, static_cast<char>(i));
            for (int sh = 24; sh >= 0; sh -= 8) out += static_cast<char>((data.size() >> sh) & 0xff);
            out += "PLTE";
            out += data;
            out.append(4, '\0');  // CRC, not checked
            copied = next;
            changed = true;
        }
        if (type == "IEND") break;
        at = next;
    }
    if (!changed) return "";
    flush(b.size());
    return out;
}

// Walks a JPEG's marker segments as stb_image walks them: junk between segments
// skipped byte by byte, the markers without a length passed over, the
// entropy-coded data after SOS up to the next marker other than FF00 and RSTn.
// visit(marker, at, len) sees each segment that has a length: b[at, at + len)
// holds the length field and the data (it may run past the file's end). It
// returns false to stop the walk.
template <class Visit>
void walk_jpeg_segments(std::string_view b, Visit&& visit) {
    auto byte = [&](size_t i) { return static_cast<unsigned char>(b[i]); };
    size_t at = 2;  // after SOI
    while (at < b.size()) {
        if (byte(at) != 0xFF) {
            ++at;
            continue;
        }
        while (at < b.size() && byte(at) == 0xFF) ++at;
        if (at >= b.size()) return;
        const unsigned m = byte(at++);
        if (m == 0xD9) return;                                                          // EOI
        if (m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length
        if (at + 2 > b.size()) return;
        const size_t len = (static_cast<size_t>(byte(at)) << 8) | byte(at + 1);
        if (!visit(m, at, len)) return;
        at += len;
        if (m == 0xDA) {
            while (at + 1 < b.size() &&
                   !(byte(at) == 0xFF && byte(at + 1) != 0x00 && !(byte(at + 1) >= 0xD0 && byte(at + 1) <= 0xD7)))
                at += byte(at) == 0xFF ? 2 : 1;
        }
    }
}

// Debian's stb_image (2.27) trusts a JPEG's tables in two ways that let a
// crafted file read or write outside them (both found by the image_reader fuzz
// harness; later stb_image versions refuse such files):
//  - a Huffman table (DHT) whose 16 counts add up to more than 256 codes is
//    written past its arrays;
//  - a scan (SOS) may name a Huffman table no DHT has defined, or a component
//    whose quantization table no DQT has: stb_image then decodes with the
//    uninitialised memory of its tables (an index out of bounds, or pixels
//    that change from run to run). libjpeg refuses both.
// The segments are walked as stb_image walks them. Returns what is wrong with
// the first bad table, "" when nothing is.
std::string jpeg_table_problem(std::string_view b) {
    auto byte = [&](size_t i) { return static_cast<unsigned char>(b[i]); };
    bool huffman[2][4] = {}, quant[4] = {}, progressive = false;
    std::vector<std::pair<unsigned, unsigned>> components;  // the frame's (id, quantization table)
    std::string problem;
    walk_jpeg_segments(b, [&](unsigned m, size_t at, size_t len) {
        const size_t end = std::min(at + len, b.size());
        if (m == 0xC4) {
            // stb_image reads a table wherever one starts inside the segment,
            // its counts even past the segment's end (zeros past the file's).
            for (size_t t = at + 2; t < at + len && t < b.size();) {
                int n = 0;
                for (size_t i = 1; i <= 16; ++i) n += t + i < b.size() ? byte(t + i) : 0;
                if (n > 256) {
                    problem = "a Huffman table with " + std::to_string(n) + " codes; at most 256";
                    return false;
                }
                if ((byte(t) >> 4) <= 1 && (byte(t) & 15) <= 3) huffman[byte(t) >> 4][byte(t) & 15] = true;
                t += 17 + static_cast<size_t>(n);
            }
        } else if (m == 0xDB) {
            for (size_t t = at + 2; t < end; t += 1 + ((byte(t) >> 4) ? 128 : 64))
                if ((byte(t) & 15) <= 3) quant[byte(t) & 15] = true;
        } else if ((m == 0xC0 || m == 0xC1 || m == 0xC2) && at + 8 <= end) {
            progressive = m == 0xC2;
            components.clear();
            for (size_t c = at + 8; c + 3 <= end && components.size() < byte(at + 7); c += 3)
                components.emplace_back(byte(c), byte(c + 2));
        } else if (m == 0xDA && at + 3 <= end) {
            const size_t n = byte(at + 2), after = at + 3 + 2 * n;
            if (after + 3 > end) return false;  // stb_image refuses a short scan header itself
            // A baseline scan decodes DC and AC; a progressive one DC first passes (Ss 0,
            // Ah 0) or AC bands (Ss > 0).
            const unsigned ss = byte(after), ah = byte(after + 2) >> 4;
            const bool dc = !progressive || (ss == 0 && ah == 0), ac = !progressive || ss != 0;
            for (size_t i = 0; i < n && problem.empty(); ++i) {
                const unsigned id = byte(at + 3 + 2 * i), td = byte(at + 4 + 2 * i) >> 4,
                               ta = byte(at + 4 + 2 * i) & 15;
                if (dc && td <= 3 && !huffman[0][td])
                    problem =
                        "a scan uses DC Huffman table " + std::to_string(td) + ", which no table before it defines";
                else if (ac && ta <= 3 && !huffman[1][ta])
                    problem =
                        "a scan uses AC Huffman table " + std::to_string(ta) + ", which no table before it defines";
                for (const auto& [cid, tq] : components)
                    if (problem.empty() && cid == id && tq <= 3 && !quant[tq])
                        problem = "a scan uses quantization table " + std::to_string(tq) +
                                  ", which no table before it defines";
            }
        }
        return problem.empty();
    });
    return problem;
}

// What the decoders give before conversion: 1 (grey) or 3 (RGB) channels of 8 bits.
struct Decoded {
    int width = 0, height = 0, channels = 0;
    std::vector<uint8_t> v;
};

Decoded decode(std::string_view bytes, const std::string& name, const PictureLimits& limits) {
    const Format format = sniff(bytes);
    if (format == Format::Unknown) throw Error(name + ": not a PNG, JPEG or BMP file");
    const size_t max_bytes = std::min<size_t>(limits.max_file_bytes, INT_MAX);  // stb_image takes an int length
    if (bytes.size() > max_bytes)
        throw Error(name + ": " + std::to_string(bytes.size()) + " bytes, more than the " + std::to_string(max_bytes) +
                    " a picture may have");
    if (format == Format::Jpeg)
        if (const std::string problem = jpeg_table_problem(bytes); !problem.empty())
            throw Error(name + ": corrupt JPEG (" + problem + ")");
    const std::string padded = format == Format::Png ? png_for_stb(bytes) : "";
    if (!padded.empty()) bytes = padded;
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    const int len = static_cast<int>(bytes.size());
    const std::string kind = format_name(format);
    auto corrupt = [&]() {
        const char* why = stb::failure_reason();
        return Error(name + ": truncated or corrupt " + kind + " (" + (why ? why : "unreadable") + ")");
    };

    // The header alone: sizes are checked before anything is allocated for pixels.
    int w = 0, h = 0, comp = 0;
    stb::set_allocation_cap(size_t(1) << 20);
    if (!stb::info(data, len, &w, &h, &comp)) {
        const char* why = stb::failure_reason();
        if (why && std::strcmp(why, "too large") == 0)
            throw Error(name + ": larger than " + std::to_string(limits.max_side) + " pixels on a side");
        throw corrupt();
    }
    if (w <= 0 || h <= 0) throw Error(name + ": the " + kind + " has no pixels");
    if (w > limits.max_side || h > limits.max_side)
        throw Error(name + ": " + std::to_string(w) + "x" + std::to_string(h) + " pixels; sides up to " +
                    std::to_string(limits.max_side) + " are accepted");
    const int64_t pixels = static_cast<int64_t>(w) * h;
    if (pixels > limits.max_pixels)
        throw Error(name + ": " + std::to_string(w) + "x" + std::to_string(h) + " = " + std::to_string(pixels) +
                    " pixels, more than the " + std::to_string(limits.max_pixels) + " accepted");
    if (format == Format::Bmp) {
        const uint64_t needed = bmp_bytes_needed(bytes);
        if (needed > bytes.size())
            throw Error(name + ": truncated BMP (its rows need " + std::to_string(needed) + " bytes, the file has " +
                        std::to_string(bytes.size()) + ")");
    }

    // No block stb_image needs for this picture is larger than 16 bytes a pixel
    // (16-bit RGBA is 8; JPEG's coefficients are 2 a sample, padded to 16x16 blocks).
    stb::set_allocation_cap(16 * (static_cast<size_t>(w) + 16) * (static_cast<size_t>(h) + 16) + (size_t(1) << 20));
    // A channel count is always asked for: with 0, stb_image's PNG reader
    // reports the file's count but may return one more (a tRNS chunk adds alpha).
    Decoded out;
    int x = 0, y = 0, n = 0;
    if (comp == 1 && stb::is_16_bit(data, len)) {
        // 16-bit grey PNG: PIL's mode "I", which convert("RGB"/"L") clamps at 255.
        uint16_t* px = stb::load_16(data, len, &x, &y, &n, 1);
        if (!px) throw corrupt();
        out.v.resize(static_cast<size_t>(x) * y);
        for (size_t i = 0; i < out.v.size(); ++i) out.v[i] = static_cast<uint8_t>(px[i] > 255 ? 255 : px[i]);
        stb::free_image(px);
        out.channels = 1;
    } else {
        // Grey (with or without alpha) as one channel, everything else as RGB: stb_image
        // drops alpha and keeps the high byte of 16-bit samples, as PIL does.
        out.channels = comp <= 2 ? 1 : 3;
        uint8_t* px = stb::load(data, len, &x, &y, &n, out.channels);
        if (!px) throw corrupt();
        out.v.assign(px, px + static_cast<size_t>(x) * y * out.channels);
        stb::free_image(px);
    }
    out.width = x;
    out.height = y;
    stb::set_allocation_cap(0);
    if (out.width != w || out.height != h)
        throw Error(name + ": corrupt " + kind + " (its header and its pixels disagree)");
    return out;
}

}  // namespace

int exif_orientation(std::string_view b) {
    const Format f = sniff(b);
    if (f == Format::Jpeg) {
        // EXIF is an APP1 segment that starts "Exif\0\0", before the first scan.
        int orientation = 0;
        walk_jpeg_segments(b, [&](unsigned m, size_t at, size_t len) {
            if (m == 0xDA) return false;
            if (m != 0xE1 || len < 8 || at + len > b.size() || b.compare(at + 2, 6, std::string_view("Exif\0\0", 6)))
                return true;
            orientation = tiff_orientation(b.substr(at + 8, len - 8));
            return false;
        });
        return orientation;
    } else if (f == Format::Png) {
        // Chunks: length, type, data, CRC; EXIF is the eXIf chunk's TIFF structure.
        for (size_t at = 8; at + 12 <= b.size();) {
            const size_t length = be32(b, at);
            if (length > b.size() - at - 12) break;
            if (b.compare(at + 4, 4, "eXIf") == 0) return tiff_orientation(b.substr(at + 8, length));
            at += 12 + length;
        }
    }
    return 0;
}

int exif_orientation_of_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string head(size_t(1) << 20, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
    return exif_orientation(head);
}

Image decode_image(std::string_view bytes, const std::string& name, const PictureLimits& limits) {
    const Decoded d = decode(bytes, name, limits);
    Image img;
    img.width = d.width;
    img.height = d.height;
    const size_t n = static_cast<size_t>(d.width) * d.height;
    img.rgb.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
        const uint8_t* s = &d.v[i * d.channels];
        uint8_t* o = &img.rgb[i * 3];
        if (d.channels == 3) {
            o[0] = s[0], o[1] = s[1], o[2] = s[2];
        } else {
            o[0] = o[1] = o[2] = s[0];  // grey replicated
        }
    }
    return img;
}

GreyImage decode_mask(std::string_view bytes, const std::string& name, const PictureLimits& limits) {
    const Decoded d = decode(bytes, name, limits);
    GreyImage m;
    m.width = d.width;
    m.height = d.height;
    const size_t n = static_cast<size_t>(d.width) * d.height;
    m.v.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const uint8_t* s = &d.v[i * d.channels];
        if (d.channels == 3) {
            const uint32_t l = 19595u * s[0] + 38470u * s[1] + 7471u * s[2] + 32768u;
            m.v[i] = static_cast<uint8_t>(l >> 16);
        } else {
            m.v[i] = s[0];
        }
    }
    return m;
}

Image read_image(const std::string& path, const std::string& what, const PictureLimits& limits) {
    const std::string bytes = read_file_capped(path, limits.max_file_bytes, what);
    return decode_image(bytes, what + " " + path, limits);
}

GreyImage read_mask(const std::string& path, const std::string& what, const PictureLimits& limits) {
    const std::string bytes = read_file_capped(path, limits.max_file_bytes, what);
    return decode_mask(bytes, what + " " + path, limits);
}

}  // namespace sd
