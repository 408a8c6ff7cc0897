// The picture and mask reader (src/io/image_reader.h) against PIL's
// convert("RGB") / convert("L") on crafted files (tests/data/pictures, made by
// make_pictures.py with PIL 9.4), and its refusals.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>
#include <sys/stat.h>
#include <unistd.h>

#include "io/image_io.h"
#include "io/image_reader.h"
#include "sd/error.h"
#include "test_util.h"

namespace {

std::string pictures() { return sdtest::env("SD_SOURCE_DIR") + "/tests/data/pictures"; }

std::string bytes_of(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path;
    return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Expected {
    std::string name;
    int w = 0, h = 0;
};

std::vector<Expected> expected_list() {
    std::vector<Expected> out;
    std::istringstream in(bytes_of(pictures() + "/expected.txt"));
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream ls(line);
        Expected e;
        if (ls >> e.name >> e.w >> e.h) out.push_back(e);
    }
    return out;
}

bool is_jpeg(const std::string& name) { return name.size() > 4 && name.substr(name.size() - 4) == ".jpg"; }

using sdtest::error_of;

TEST(ImageReader, PngAndBmpConvertExactlyAsPil) {
    const auto list = expected_list();
    ASSERT_GE(list.size(), 20u);
    int compared = 0;
    for (const auto& e : list) {
        if (is_jpeg(e.name)) continue;
        SCOPED_TRACE(e.name);
        const std::string file = bytes_of(pictures() + "/" + e.name);
        const sd::Image img = sd::decode_image(file, e.name);
        ASSERT_EQ(img.width, e.w);
        ASSERT_EQ(img.height, e.h);
        const std::string rgb = bytes_of(pictures() + "/" + e.name + ".rgb");
        EXPECT_EQ(std::string(img.rgb.begin(), img.rgb.end()), rgb);
        const sd::GreyImage mask = sd::decode_mask(file, e.name);
        ASSERT_EQ(mask.width, e.w);
        const std::string l = bytes_of(pictures() + "/" + e.name + ".l");
        EXPECT_EQ(std::string(mask.v.begin(), mask.v.end()), l);
        ++compared;
    }
    EXPECT_GE(compared, 18);
}

// stb_image's JPEG decoder is not libjpeg: on smooth pictures the two stay a
// few levels apart (measured: at most 2 on these two files).
TEST(ImageReader, JpegIsCloseToPil) {
    for (const char* name : {"rgb.jpg", "grey.jpg", "exif6.jpg"}) {
        SCOPED_TRACE(name);
        const std::string file = bytes_of(pictures() + "/" + name);
        const sd::Image img = sd::decode_image(file, name);
        const std::string rgb = bytes_of(pictures() + "/" + name + ".rgb");
        ASSERT_EQ(img.rgb.size(), rgb.size());
        int worst = 0;
        for (size_t i = 0; i < rgb.size(); ++i)
            worst = std::max(worst, std::abs(int(img.rgb[i]) - int(static_cast<unsigned char>(rgb[i]))));
        EXPECT_LE(worst, 4);
    }
}

TEST(ImageReader, AlphaIsDroppedNotComposited) {
    // rgba8.png's first row is fully transparent: its colours survive, as in PIL.
    const std::string file = bytes_of(pictures() + "/rgba8.png");
    const sd::Image img = sd::decode_image(file, "rgba8.png");
    const std::string rgb = bytes_of(pictures() + "/rgba8.png.rgb");
    bool any_dark = false, any_light = false;
    for (int x = 0; x < img.width * 3; ++x) {
        EXPECT_EQ(img.rgb[x], static_cast<unsigned char>(rgb[x]));
        any_dark = any_dark || img.rgb[x] < 100;
        any_light = any_light || img.rgb[x] > 155;
    }
    EXPECT_TRUE(any_dark && any_light);  // not all black or white, as compositing would make them
}

TEST(ImageReader, SixteenBitGreyIsClampedTheOthersKeepTheHighByte) {
    // grey16.png holds 16-bit values; PIL (mode "I") clamps, so any value >= 255 is white.
    const sd::Image grey = sd::decode_image(bytes_of(pictures() + "/grey16.png"), "grey16.png");
    const std::string l = bytes_of(pictures() + "/grey16.png.l");
    int white = 0, other = 0;
    for (size_t i = 0; i < l.size(); ++i) {
        EXPECT_EQ(grey.rgb[i * 3], static_cast<unsigned char>(l[i]));
        (static_cast<unsigned char>(l[i]) == 255 ? white : other)++;
    }
    EXPECT_GT(white, 0);
    EXPECT_GT(other, 0);
}

TEST(ImageReader, FilesThatAreNotPicturesAreRefusedInOneLine) {
    const std::string png = bytes_of(pictures() + "/rgb8.png");
    const std::string jpg = bytes_of(pictures() + "/rgb.jpg");
    const std::string bmp = bytes_of(pictures() + "/rgb24.bmp");
    struct Case {
        std::string bytes, expect;
    } cases[] = {
        {"", "not a PNG, JPEG or BMP file"},
        {"GIF89a\x01\x00\x01\x00", "not a PNG, JPEG or BMP file"},
        {"RIFF....WEBPVP8 ", "not a PNG, JPEG or BMP file"},
        {png.substr(0, png.size() / 2), "truncated or corrupt PNG"},
        {png.substr(0, 20), "truncated or corrupt PNG"},
        {jpg.substr(0, jpg.size() - 2), "truncated or corrupt JPEG"},
        {jpg.substr(0, jpg.size() / 2), "truncated or corrupt JPEG"},
        {bmp.substr(0, bmp.size() - 1), "truncated BMP"},
        {bmp.substr(0, 40), "truncated"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.expect);
        for (bool mask : {false, true}) {
            const std::string msg = error_of([&] {
                if (mask) sd::decode_mask(c.bytes, "--mask m.png");
                else sd::decode_image(c.bytes, "--init-img i.png");
            });
            EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
            EXPECT_EQ(msg.rfind(mask ? "--mask m.png: " : "--init-img i.png: ", 0), 0u) << msg;
            EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        }
    }
}

// Found by the image_reader fuzz harness: a JPEG Huffman table whose 16 counts
// add up to more than 256 made Debian's stb_image 2.27 write past its table
// (UBSan: index 257 out of bounds for stbi_uc[257]). Refused before stb_image
// reads the file, also when the table follows another one in the same segment.
TEST(ImageReader, JpegHuffmanTableWithMoreThan256CodesIsRefused) {
    std::string jpg = bytes_of(pictures() + "/rgb.jpg");
    const size_t dht = jpg.find("\xff\xc4");
    ASSERT_NE(dht, std::string::npos);
    const size_t len = (static_cast<unsigned char>(jpg[dht + 2]) << 8) | static_cast<unsigned char>(jpg[dht + 3]);
    // The first table's counts, raised to 17 codes of each length (272).
    std::string bad = jpg;
    for (size_t i = 0; i < 16; ++i) bad[dht + 5 + i] = 17;
    std::string msg = error_of([&] { sd::decode_image(bad, "h.jpg"); });
    EXPECT_EQ(msg, "h.jpg: corrupt JPEG (a Huffman table with 272 codes; at most 256)");
    // A second table in the same segment: the first one's length is kept, the
    // second one's counts raised.
    size_t first_n = 0;
    for (size_t i = 0; i < 16; ++i) first_n += static_cast<unsigned char>(jpg[dht + 5 + i]);
    if (dht + 4 + 17 + first_n < dht + 2 + len) {
        bad = jpg;
        for (size_t i = 0; i < 16; ++i) bad[dht + 4 + 17 + first_n + 1 + i] = static_cast<char>(0x40);
        msg = error_of([&] { sd::decode_mask(bad, "h.jpg"); });
        EXPECT_EQ(msg, "h.jpg: corrupt JPEG (a Huffman table with 1024 codes; at most 256)");
    }
    // The fuzzer's own input.
    const std::string found =
        bytes_of(sdtest::env("SD_SOURCE_DIR") + "/tests/data/fuzz-inputs/image_reader/jpeg_dht_over_256_codes");
    msg = error_of([&] { sd::decode_image(found.substr(1), "f.jpg"); });
    EXPECT_NE(msg.find("f.jpg: corrupt JPEG"), std::string::npos) << msg;
}

// Found by the image_reader fuzz harness: an empty IDAT chunk before the data
// made stb_image memcpy to a null pointer (UBSan). Empty IDAT chunks are dropped
// before stb_image reads the file: the picture reads as without them.
TEST(ImageReader, EmptyIdatChunksAreHarmless) {
    const std::string png = bytes_of(pictures() + "/rgb8.png");
    const size_t idat = png.find("IDAT") - 4;
    const std::string empty_idat = std::string("\0\0\0\0IDAT", 8) + std::string("\x35\xaf\x06\x1e", 4);
    const std::string with = png.substr(0, idat) + empty_idat + png.substr(idat);
    EXPECT_EQ(sd::decode_image(with, "e.png").rgb, sd::decode_image(png, "p.png").rgb);
    // Only an empty IDAT: no pixels at all.
    const size_t iend = png.find("IEND") - 4;
    const std::string only = png.substr(0, idat) + empty_idat + png.substr(iend);
    EXPECT_NE(error_of([&] { sd::decode_image(only, "o.png"); }).find("o.png: truncated or corrupt PNG"), std::string::npos);
    // The file ends inside the empty IDAT's CRC (found by the image_reader fuzz harness:
    // stb_image copied 0 bytes to a null pointer; the sanitizer build reports that).
    for (size_t cut = 8; cut < 12; ++cut) {
        const std::string short_crc = png.substr(0, idat) + empty_idat.substr(0, cut);
        EXPECT_NE(error_of([&] { sd::decode_image(short_crc, "s.png"); }).find("s.png: "), std::string::npos) << cut;
    }
}

// Found by the image_reader fuzz harness: a scan naming a Huffman table no DHT
// defined made Debian's stb_image 2.27 decode with its uninitialised tables (an
// assertion in its debug build; an index out of bounds or changing pixels in a
// release one). Refused before stb_image reads the file, as libjpeg refuses it;
// so is a component whose quantization table no DQT defined.
TEST(ImageReader, JpegScanWithUndefinedTablesIsRefused) {
    const std::string jpg = bytes_of(pictures() + "/rgb.jpg");
    auto marker = [&](const std::string& file, const char* m, size_t nth = 0) {
        size_t at = file.find(m);
        for (size_t i = 0; i < nth && at != std::string::npos; ++i) at = file.find(m, at + 2);
        return at;
    };
    // Every DHT renamed to id 3 of its class: the scan's tables 0 and 1 are undefined.
    std::string bad = jpg;
    for (size_t i = 0, at; (at = marker(bad, "\xff\xc4", i)) != std::string::npos; ++i) {
        const size_t len = (static_cast<unsigned char>(bad[at + 2]) << 8) | static_cast<unsigned char>(bad[at + 3]);
        for (size_t t = at + 4; t < at + 2 + len;) {
            size_t n = 0;
            for (size_t k = 1; k <= 16; ++k) n += static_cast<unsigned char>(bad[t + k]);
            bad[t] = static_cast<char>((bad[t] & 0xf0) | 3);
            t += 17 + n;
        }
    }
    EXPECT_EQ(error_of([&] { sd::decode_image(bad, "u.jpg"); }),
              "u.jpg: corrupt JPEG (a scan uses DC Huffman table 0, which no table before it defines)");
    // Every DQT renamed to id 3: the frame's quantization table 0 is undefined.
    bad = jpg;
    for (size_t i = 0, at; (at = marker(bad, "\xff\xdb", i)) != std::string::npos; ++i) {
        const size_t len = (static_cast<unsigned char>(bad[at + 2]) << 8) | static_cast<unsigned char>(bad[at + 3]);
        for (size_t t = at + 4; t < at + 2 + len; t += 1 + ((static_cast<unsigned char>(bad[t]) >> 4) ? 128 : 64))
            bad[t] = static_cast<char>((bad[t] & 0xf0) | 3);
    }
    EXPECT_EQ(error_of([&] { sd::decode_mask(bad, "q.jpg"); }),
              "q.jpg: corrupt JPEG (a scan uses quantization table 0, which no table before it defines)");
    // The fuzzer's own input (its AC table 0 renamed to 2).
    const std::string found = bytes_of(sdtest::env("SD_SOURCE_DIR") +
                                       "/tests/data/fuzz-inputs/image_reader/jpeg_scan_uses_undefined_huffman_table");
    EXPECT_EQ(error_of([&] { sd::decode_image(found.substr(1), "f.jpg"); }),
              "f.jpg: corrupt JPEG (a scan uses AC Huffman table 0, which no table before it defines)");
    // The tables where they belong: the picture decodes (JpegIsCloseToPil compares it).
    EXPECT_EQ(error_of([&] { sd::decode_image(jpg, "g.jpg"); }), "");
}

// A PNG header claiming a size, with no pixel data behind it: refused from the
// header alone, before decoding.
std::string png_header_only(uint32_t w, uint32_t h) {
    std::string ihdr = "IHDR";
    for (uint32_t v : {w, h})
        for (int s = 24; s >= 0; s -= 8) ihdr += static_cast<char>((v >> s) & 0xff);
    ihdr += std::string("\x08\x02\x00\x00\x00", 5);
    std::string out = "\x89PNG\r\n\x1a\n";
    out += std::string("\x00\x00\x00\x0d", 4) + ihdr + std::string(4, '\0');  // CRC not checked by stb_image
    return out;
}

TEST(ImageReader, SizesOverTheLimitsAreRefusedBeforeDecoding) {
    EXPECT_NE(error_of([] { sd::decode_image(png_header_only(16385, 8), "big.png"); }).find("16385x8 pixels; sides up to 16384"),
              std::string::npos);
    EXPECT_NE(error_of([] { sd::decode_image(png_header_only(8, 20000), "big.png"); }).find("sides up to 16384"),
              std::string::npos);
    // 16384 x 16384 = 268 megapixels: each side is fine, the total is not.
    const std::string msg = error_of([] { sd::decode_image(png_header_only(16384, 16384), "big.png"); });
    EXPECT_NE(msg.find("268435456 pixels, more than the 256000000 accepted"), std::string::npos) << msg;
    EXPECT_NE(error_of([] { sd::decode_image(png_header_only(0x7fffffff, 1), "huge.png"); }).find("huge.png: "),
              std::string::npos);
    // Within the limits, the missing data is what is reported.
    EXPECT_NE(error_of([] { sd::decode_image(png_header_only(64, 64), "p.png"); }).find("truncated or corrupt PNG"),
              std::string::npos);
    // Custom limits (the fuzz harness uses small ones).
    sd::PictureLimits small;
    small.max_side = 4;
    EXPECT_NE(error_of([&] { sd::decode_image(bytes_of(pictures() + "/rgb8.png"), "p", small); }).find("7x5 pixels"),
              std::string::npos);
    small = {};
    small.max_file_bytes = 10;
    EXPECT_NE(error_of([&] { sd::decode_image(bytes_of(pictures() + "/rgb8.png"), "p", small); }).find("bytes, more than"),
              std::string::npos);
}

// A 64x64 PNG whose zlib stream inflates to 64 MiB: stb_image would grow its
// buffer to hold all of it (up to 4 GB for other files); the allocation cap,
// sized from the header, stops it with one line.
TEST(ImageReader, InflatingPngIsStoppedByTheAllocationCap) {
    const std::string file = bytes_of(pictures() + "/inflates_64mib.png");
    ASSERT_LT(file.size(), 100000u);
    const std::string msg = error_of([&] { sd::decode_image(file, "bomb.png"); });
    EXPECT_EQ(msg, "bomb.png: truncated or corrupt PNG (outofmem)");
    // The cap is per decode: a good picture still reads afterwards.
    EXPECT_EQ(sd::decode_image(bytes_of(pictures() + "/rgb8.png"), "p").width, 7);
}

TEST(ImageReader, ReadsFilesThroughTheCappedReader) {
    const std::string dir = sdtest::temp_dir();
    EXPECT_EQ(sd::read_image(pictures() + "/rgb8.png", "--init-img").width, 7);
    EXPECT_EQ(sd::read_mask(pictures() + "/grey8.png", "--mask").height, 6);
    std::string msg = error_of([&] { sd::read_image(dir + "/missing.png", "--init-img"); });
    EXPECT_EQ(msg, "--init-img " + dir + "/missing.png does not exist");
    msg = error_of([&] { sd::read_mask(dir, "--mask"); });
    EXPECT_NE(msg.find("is a folder"), std::string::npos) << msg;
    const std::string fifo = dir + "/fifo.png";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    msg = error_of([&] { sd::read_image(fifo, "--init-img"); });
    EXPECT_NE(msg.find("FIFO"), std::string::npos) << msg;
    sd::PictureLimits small;
    small.max_file_bytes = 16;
    msg = error_of([&] { sd::read_image(pictures() + "/rgb8.png", "--init-img", small); });
    EXPECT_NE(msg.find("more than the 16"), std::string::npos) << msg;
}

TEST(ImageReader, ReadPngStillReadsTheToolsOwnOutput) {
    sd::Image img;
    img.width = 3;
    img.height = 2;
    for (int i = 0; i < 18; ++i) img.rgb.push_back(static_cast<uint8_t>(i * 13));
    const std::string path = sdtest::temp_dir() + "/x.png";
    ASSERT_TRUE(sd::save_png_new(path, img));
    EXPECT_EQ(sd::read_png(path).rgb, img.rgb);
    EXPECT_NE(error_of([] { sd::read_png(pictures() + "/rgb24.bmp"); }).find("not a PNG"), std::string::npos);
}

}  // namespace

// EXIF orientation: read from a JPEG's APP1 and a PNG's eXIf, never applied (the
// references' PIL Image.open decodes the pixels as stored: exif6.jpg and exif8.png
// are compared with PIL above); bounded on damaged structures.
namespace {

// A TIFF structure whose first IFD holds `tags` (tag, type, count, value), in
// either byte order.
std::string tiff(bool little, const std::vector<std::array<uint32_t, 4>>& tags) {
    std::string t = little ? "II" : "MM";
    auto put16 = [&](uint32_t v) {
        if (little) t += char(v & 0xff), t += char(v >> 8);
        else t += char(v >> 8), t += char(v & 0xff);
    };
    auto put32 = [&](uint32_t v) {
        if (little) put16(v & 0xffff), put16(v >> 16);
        else put16(v >> 16), put16(v & 0xffff);
    };
    put16(42);
    put32(8);
    put16(static_cast<uint32_t>(tags.size()));
    for (const auto& [tag, type, count, value] : tags) {
        put16(tag), put16(type), put32(count);
        if (type == 3) put16(value), put16(0);
        else put32(value);
    }
    put32(0);
    return t;
}

std::string jpeg_with(const std::string& tiff_bytes) {
    const std::string app0 = std::string("\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00", 18);
    const std::string payload = std::string("Exif\0\0", 6) + tiff_bytes;
    const size_t len = payload.size() + 2;
    return std::string("\xff\xd8", 2) + app0 + "\xff\xe1" + char(len >> 8) + char(len & 0xff) + payload +
           std::string("\xff\xda\x00\x02", 4);
}

std::string png_with(const std::string& tiff_bytes) {
    auto be = [](size_t v) { return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; };
    const std::string ihdr = std::string("\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00", 13);
    return std::string("\x89PNG\r\n\x1a\n", 8) + be(13) + "IHDR" + ihdr + be(0) + be(tiff_bytes.size()) + "eXIf" +
           tiff_bytes + be(0) + be(0) + "IEND" + be(0);
}

}  // namespace

TEST(ImageReader, ExifOrientationIsReadNotApplied) {
    EXPECT_EQ(sd::exif_orientation(bytes_of(pictures() + "/exif6.jpg")), 6);
    EXPECT_EQ(sd::exif_orientation(bytes_of(pictures() + "/exif8.png")), 8);
    for (const char* plain : {"rgb.jpg", "rgb8.png", "rgb24.bmp"})
        EXPECT_EQ(sd::exif_orientation(bytes_of(pictures() + "/" + plain)), 0) << plain;

    // Either byte order, after other tags; the first IFD's entry only.
    for (bool little : {true, false}) {
        const std::string t = tiff(little, {{0x010f, 2, 4, 0}, {0x0112, 3, 1, 3}});
        EXPECT_EQ(sd::exif_orientation(jpeg_with(t)), 3) << little;
        EXPECT_EQ(sd::exif_orientation(png_with(t)), 3) << little;
    }
    // Not one SHORT from 1 to 8: no orientation.
    for (const auto& entry : std::vector<std::array<uint32_t, 4>>{{0x0112, 4, 1, 6}, {0x0112, 3, 2, 6},
                                                                  {0x0112, 3, 1, 9}, {0x0112, 3, 1, 0}})
        EXPECT_EQ(sd::exif_orientation(jpeg_with(tiff(true, {entry}))), 0);
}

TEST(ImageReader, DamagedExifGivesNoOrientation) {
    const std::string t = tiff(false, {{0x0112, 3, 1, 6}});
    for (const std::string& file : {jpeg_with(t), png_with(t)}) {
        // Every truncation: within bounds (the fuzz build checks the reads), 0 or the full answer.
        for (size_t n = 0; n <= file.size(); ++n) {
            const int o = sd::exif_orientation(std::string_view(file).substr(0, n));
            EXPECT_TRUE(o == 0 || o == 6) << n;
        }
    }
    // An IFD offset or an entry count past the end.
    std::string far = t;
    far[4] = far[5] = far[6] = '\x7f';
    EXPECT_EQ(sd::exif_orientation(jpeg_with(far)), 0);
    std::string many = tiff(false, {{0x010f, 2, 4, 0}});  // no orientation among the entries that exist
    many[8] = many[9] = '\xff';
    EXPECT_EQ(sd::exif_orientation(png_with(many)), 0);
    // A segment or chunk length past the end.
    std::string jpeg = jpeg_with(t);
    jpeg[22] = jpeg[23] = '\xff';
    EXPECT_EQ(sd::exif_orientation(jpeg), 0);
    std::string png = png_with(t);
    png[33] = '\x7f';
    EXPECT_EQ(sd::exif_orientation(png), 0);
}
