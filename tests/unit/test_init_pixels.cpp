// prepare_init_pixels (src/image/init_pixels.h): the whole pixel side of
// img2img, inpainting and outpainting in one call, against the inpaint cases
// and on the geometry of outpaint, invert and resize.
#include <gtest/gtest.h>

#include <filesystem>

#include "image/init_pixels.h"
#include "io/image_reader.h"
#include "io/npy.h"
#include "sd/error.h"
#include "picture_cases.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::vector<float> floats(const sd::NpyArray& a) { return std::vector<float>(a.as<float>(), a.as<float>() + a.numel()); }

using sdtest::error_of;

sd::Image gradient(int w, int h) {
    sd::Image img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            uint8_t* p = &img.rgb[(static_cast<size_t>(y) * w + x) * 3];
            p[0] = static_cast<uint8_t>(x * 8), p[1] = static_cast<uint8_t>(y * 8), p[2] = 90;
        }
    return img;
}

TEST(InitPixels, InpaintCasesAreReproducedExactly) {
    int checked = 0;
    for (const auto& c : sdtest::inpaint_picture_cases()) {
        SCOPED_TRACE(c.dir);
        const fs::path e = c.dir;
        const sd::Image& img = c.picture;
        const sd::GreyImage& mask = c.mask;
        sd::InitPixelOptions o;
        o.width = img.width;
        o.height = img.height;
        const auto p = sd::prepare_init_pixels(img, &mask, o);
        ASSERT_TRUE(p.has_mask());
        EXPECT_EQ(p.image.rgb, img.rgb);
        EXPECT_EQ(p.image_chw, floats(sd::read_npy((e / "init_image.npy").string())));
        EXPECT_EQ(p.mask, floats(sd::read_npy((e / "mask.npy").string())));
        EXPECT_EQ(p.masked_image_chw, floats(sd::read_npy((e / "masked_image.npy").string())));
        const auto lat = floats(sd::read_npy((e / "mask_latent.npy").string()));
        EXPECT_EQ(std::vector<float>(lat.begin(), lat.begin() + static_cast<long>(p.mask_latent.size())), p.mask_latent);
        EXPECT_EQ(p.soft_mask.v, mask.v);  // no invert, no blur
        ++checked;
    }
    EXPECT_EQ(checked, 6);
}

TEST(InitPixels, Img2ImgWithoutAMaskResizesOnly) {
    const auto img = gradient(20, 10);
    sd::InitPixelOptions o;
    o.width = 16;
    o.height = 16;
    o.resize_mode = sd::ResizeMode::Crop;
    const auto p = sd::prepare_init_pixels(img, nullptr, o);
    EXPECT_FALSE(p.has_mask());
    EXPECT_EQ(p.image.width, 16);
    EXPECT_EQ(p.image.height, 16);
    EXPECT_EQ(p.image_chw.size(), 3u * 16 * 16);
    EXPECT_TRUE(p.masked_image_chw.empty());
    EXPECT_TRUE(p.mask_latent.empty());
    // Kept at its own size without width and height.
    EXPECT_EQ(sd::prepare_init_pixels(img, nullptr, {}).image.rgb, img.rgb);
}

TEST(InitPixels, OutpaintJoinsTheUsersMaskAndFillsOnlyTheMaskedArea) {
    const auto img = gradient(16, 16);
    sd::GreyImage mask{16, 16, std::vector<uint8_t>(256, 0)};
    for (int y = 0; y < 8; ++y)
        for (int x = 0; x < 8; ++x) mask.v[static_cast<size_t>(y) * 16 + x] = 255;  // the top-left quarter
    sd::InitPixelOptions o;
    o.outpaint = sd::OutpaintMargins{8, 0, 8, 0};
    o.masked_content = sd::MaskedContent::Fill;
    const auto p = sd::prepare_init_pixels(img, &mask, o);
    ASSERT_EQ(p.image.width, 32);
    ASSERT_EQ(p.image.height, 16);
    for (int y = 0; y < 16; ++y)
        for (int x = 0; x < 32; ++x) {
            const bool picture = x >= 8 && x < 24, users = picture && x < 16 && y < 8;
            const size_t i = static_cast<size_t>(y) * 32 + x;
            ASSERT_EQ(p.mask[i], picture && !users ? 0.0f : 1.0f) << x << "," << y;
            if (picture && !users) {  // kept: the picture's own pixels, also after the fill
                for (int c = 0; c < 3; ++c) {
                    ASSERT_EQ(p.image.rgb[i * 3 + c], img.rgb[(static_cast<size_t>(y) * 16 + x - 8) * 3 + c]);
                    ASSERT_EQ(p.original.rgb[i * 3 + c], p.image.rgb[i * 3 + c]);
                }
            }
            if (!picture) ASSERT_EQ(p.original.rgb[i * 3 + 2], 0);  // black before the fill
            if (!picture) ASSERT_GT(p.image.rgb[i * 3 + 2], 60);     // the picture's blue after it
        }
    EXPECT_EQ(p.mask_latent, std::vector<float>({1, 1, 0, 1, 1, 0, 0, 1}));
}

TEST(InitPixels, InvertAndResizeKeepTheMaskOnItsPixels) {
    const auto img = gradient(32, 16);
    sd::GreyImage mask{32, 16, std::vector<uint8_t>(512, 0)};
    for (int y = 0; y < 16; ++y)
        for (int x = 0; x < 16; ++x) mask.v[static_cast<size_t>(y) * 32 + x] = 255;  // left half
    sd::InitPixelOptions o;
    o.width = 64;
    o.height = 32;
    o.invert_mask = true;
    o.mask_blur = 2;
    const auto p = sd::prepare_init_pixels(img, &mask, o);
    for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 64; ++x) {
            const float v = p.mask[static_cast<size_t>(y) * 64 + x];
            if (x < 28) ASSERT_EQ(v, 0.0f) << x;  // was repainted, inverted: kept
            if (x >= 36) ASSERT_EQ(v, 1.0f) << x;
        }
    // The soft mask blends across the edge.
    EXPECT_GT(p.soft_mask.v[31], 0);
    EXPECT_LT(p.soft_mask.v[31], 255);
}

TEST(InitPixels, RefusesAMaskOfAnotherSizeAndSidesOffTheLatentGrid) {
    const auto img = gradient(16, 16);
    sd::GreyImage small{8, 8, std::vector<uint8_t>(64, 255)};
    sd::InitPixelOptions o;
    o.mask_what = "--mask m.png";
    EXPECT_EQ(error_of([&] { sd::prepare_init_pixels(img, &small, o); }),
              "--mask m.png: the mask is 8x8 but the picture is 16x16; they must be the same size");
    sd::GreyImage full{16, 16, std::vector<uint8_t>(256, 255)};
    o.width = 20;
    EXPECT_NE(error_of([&] { sd::prepare_init_pixels(img, &full, o); }).find("multiple of 8"), std::string::npos);
}

}  // namespace
