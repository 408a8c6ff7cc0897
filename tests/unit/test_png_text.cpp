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
