// PNG text chunks (io/png_text.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "test_util.h"
#include "io/image_io.h"
#include "io/png_text.h"

TEST(PngText, ITxtRoundTripWithValidCrc) {
    sd::Image img;
    img.width = 3;
    img.height = 2;
    img.rgb.assign(18, 100);
    const auto png = sd::encode_png(img);
    const std::string text = "un café, 猫 🐱\nSteps: 5";
    const auto with = sd::png_add_itxt(png, "parameters", text);
    auto texts = sd::png_read_text(with);  // checks every CRC
    EXPECT_EQ(texts.at("parameters"), text);
    // still an image that stb reads, with the same pixels
    const std::string path = sdtest::temp_dir() + "/t.png";
    sdtest::write_text(path, std::string(with.begin(), with.end()));
    EXPECT_EQ(sd::read_png(path).rgb, img.rgb);
    // a flipped byte in the chunk is caught by the CRC
    auto bad = with;
    bad[40] ^= 1;
    EXPECT_THROW(sd::png_read_text(bad), sd::Error);
    EXPECT_EQ(sd::png_crc32(reinterpret_cast<const uint8_t*>("IEND"), 4), 0xAE426082u);
}

namespace {

std::vector<uint8_t> small_png() {
    sd::Image img;
    img.width = img.height = 2;
    img.rgb.assign(12, 50);
    return sd::encode_png(img);
}

// png with a chunk of any type and data right after IHDR (33 bytes in), its CRC valid unless told.
std::vector<uint8_t> with_chunk(const std::vector<uint8_t>& png, const std::string& type, const std::string& data,
                                bool good_crc = true) {
    std::vector<uint8_t> c;
    for (int s = 24; s >= 0; s -= 8) c.push_back(static_cast<uint8_t>(data.size() >> s));
    c.insert(c.end(), type.begin(), type.end());
    c.insert(c.end(), data.begin(), data.end());
    uint32_t crc = sd::png_crc32(c.data() + 4, c.size() - 4) ^ (good_crc ? 0u : 1u);
    for (int s = 24; s >= 0; s -= 8) c.push_back(static_cast<uint8_t>(crc >> s));
    std::vector<uint8_t> out(png.begin(), png.begin() + 33);
    out.insert(out.end(), c.begin(), c.end());
    out.insert(out.end(), png.begin() + 33, png.end());
    return out;
}

std::string message_of(const std::vector<uint8_t>& png, const sd::PngTextLimits& limits = {}) {
    try {
        sd::png_read_text(png, limits);
    } catch (const sd::Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

// tEXt is Latin-1 (PNG standard; PIL and AUTOMATIC1111 store "café" so): read as UTF-8.
TEST(PngText, TextChunkIsLatin1) {
    const auto png = with_chunk(small_png(), "tEXt", std::string("parameters\0un caf\xe9 \xff", 20));
    EXPECT_EQ(sd::png_read_text(png).at("parameters"), "un caf\xc3\xa9 \xc3\xbf");
    EXPECT_EQ(sd::latin1_to_utf8("A\x80"), "A\xc2\x80");
}

// iTXt is UTF-8: bytes that are not are refused, on reading and on writing.
TEST(PngText, ITxtMustBeUtf8) {
    const auto png = with_chunk(small_png(), "iTXt", std::string("parameters\0\0\0\0\0caf\xe9", 19));
    EXPECT_NE(message_of(png).find("iTXt chunk \"parameters\" is not valid UTF-8"), std::string::npos) << message_of(png);
    EXPECT_THROW(sd::png_add_itxt(small_png(), "parameters", "caf\xe9"), sd::Error);
}

// A text chunk over the per-chunk bound, or text over the total bound, is refused by name.
TEST(PngText, TextIsBounded) {
    const auto big = with_chunk(small_png(), "tEXt", std::string("parameters", 10) + '\0' + std::string(3000, 'a'));
    EXPECT_NE(message_of(big, {1000, 10000}).find("text chunk \"parameters\" holds 3000 bytes; the limit is 1000"),
              std::string::npos)
        << message_of(big, {1000, 10000});
    EXPECT_EQ(sd::png_read_text(big, {3000, 10000}).at("parameters").size(), 3000u);
    const auto two = with_chunk(big, "tEXt", std::string("other", 5) + '\0' + std::string(3000, 'b'));
    EXPECT_NE(message_of(two, {4000, 5000}).find("text chunks hold more than 5000 bytes"), std::string::npos);
}

// A chunk whose CRC is wrong is named with its type escaped: no raw control bytes in the message.
TEST(PngText, BadCrcNamesTheTypeEscaped) {
    const auto png = with_chunk(small_png(), std::string("\x1b[2J", 4), "x", false);
    const std::string m = message_of(png);
    EXPECT_NE(m.find("bad CRC in PNG chunk \\x1b[2J"), std::string::npos) << m;
    EXPECT_EQ(m.find('\x1b'), std::string::npos);
}
