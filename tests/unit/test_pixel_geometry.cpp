// Pixel geometry of img2img, inpainting and outpainting (src/image/): which
// pixels the resize modes, the outpaint canvas and the mask blur change and
// which they leave alone; the mask preprocessing against the inpaint cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "image/mask.h"
#include "image/outpaint.h"
#include "image/resize.h"
#include "io/image_reader.h"
#include "io/npy.h"
#include "sd/error.h"
#include "picture_cases.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using sdtest::error_of;

const uint8_t* px(const sd::Image& img, int x, int y) { return &img.rgb[(static_cast<size_t>(y) * img.width + x) * 3]; }
bool same_px(const sd::Image& a, int ax, int ay, const sd::Image& b, int bx, int by) {
    return std::memcmp(px(a, ax, ay), px(b, bx, by), 3) == 0;
}

// Every pixel different from its neighbours (a position code), so that a copy
// can be told apart from a shifted or resampled one.
sd::Image coded(int w, int h) {
    sd::Image img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            uint8_t* p = &img.rgb[(static_cast<size_t>(y) * w + x) * 3];
            p[0] = static_cast<uint8_t>(x * 5 + 1), p[1] = static_cast<uint8_t>(y * 7 + 2), p[2] = static_cast<uint8_t>(x ^ y);
        }
    return img;
}

sd::Image solid(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
    sd::Image img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
    for (size_t i = 0; i < img.rgb.size(); i += 3) img.rgb[i] = r, img.rgb[i + 1] = g, img.rgb[i + 2] = b;
    return img;
}

// --- resize modes ---

TEST(ResizeModes, PlacementIsA1111s) {
    // Crop: the picture covers the canvas, its middle kept.
    auto p = sd::resize_placement(100, 50, 64, 64, sd::ResizeMode::Crop);
    EXPECT_EQ(p.scaled_w, 128);
    EXPECT_EQ(p.scaled_h, 64);
    EXPECT_EQ(p.x, -32);
    EXPECT_EQ(p.y, 0);
    p = sd::resize_placement(50, 101, 64, 64, sd::ResizeMode::Crop);  // 101 * 64 // 50 = 129
    EXPECT_EQ(p.scaled_w, 64);
    EXPECT_EQ(p.scaled_h, 129);
    EXPECT_EQ(p.y, 32 - 64);
    // Fill: the picture fits inside, centred.
    p = sd::resize_placement(100, 50, 64, 64, sd::ResizeMode::Fill);
    EXPECT_EQ(p.scaled_w, 64);
    EXPECT_EQ(p.scaled_h, 32);
    EXPECT_EQ(p.x, 0);
    EXPECT_EQ(p.y, 16);
    p = sd::resize_placement(30, 70, 64, 48, sd::ResizeMode::Fill);  // 30 * 48 // 70 = 20
    EXPECT_EQ(p.scaled_w, 20);
    EXPECT_EQ(p.scaled_h, 48);
    EXPECT_EQ(p.x, 32 - 10);
    // Just: stretched.
    p = sd::resize_placement(30, 70, 64, 48, sd::ResizeMode::Just);
    EXPECT_EQ(p.scaled_w, 64);
    EXPECT_EQ(p.scaled_h, 48);
    EXPECT_EQ(p.x, 0);
}

TEST(ResizeModes, CropKeepsTheMiddleColumnsExactly) {
    // 40x20 onto 20x20: scaled to 40x20 (its own size, so not resampled), x = -10.
    const auto src = coded(40, 20);
    const auto out = sd::fit_image(src, 20, 20, sd::ResizeMode::Crop);
    ASSERT_EQ(out.width, 20);
    ASSERT_EQ(out.height, 20);
    for (int y = 0; y < 20; ++y)
        for (int x = 0; x < 20; ++x) ASSERT_TRUE(same_px(out, x, y, src, x + 10, y)) << x << "," << y;
}

TEST(ResizeModes, FillStretchesTheEdgeRowsIntoTheBands) {
    // 20x10 onto 20x20: the picture at rows 5..14, rows 0..4 copies of its top
    // row, rows 15..19 of its bottom row.
    const auto src = coded(20, 10);
    const auto out = sd::fit_image(src, 20, 20, sd::ResizeMode::Fill);
    for (int y = 0; y < 20; ++y)
        for (int x = 0; x < 20; ++x) {
            const int sy = y < 5 ? 0 : y < 15 ? y - 5 : 9;
            ASSERT_TRUE(same_px(out, x, y, src, x, sy)) << x << "," << y;
        }
    // Columns: 10x20 onto 20x20, the picture at columns 5..14.
    const auto tall = coded(10, 20);
    const auto out2 = sd::fit_image(tall, 20, 20, sd::ResizeMode::Fill);
    for (int y = 0; y < 20; ++y)
        for (int x = 0; x < 20; ++x) {
            const int sx = x < 5 ? 0 : x < 15 ? x - 5 : 9;
            ASSERT_TRUE(same_px(out2, x, y, tall, sx, y)) << x << "," << y;
        }
}

TEST(ResizeModes, ResamplingKeepsFlatAreasAndTheSameSizeIsACopy) {
    const auto src = coded(13, 9);
    EXPECT_EQ(sd::fit_image(src, 13, 9, sd::ResizeMode::Just).rgb, src.rgb);
    EXPECT_EQ(sd::fit_image(src, 13, 9, sd::ResizeMode::Crop).rgb, src.rgb);
    EXPECT_EQ(sd::fit_image(src, 13, 9, sd::ResizeMode::Fill).rgb, src.rgb);
    // Left half black, right half white, stretched: away from the edge the
    // halves stay pure (Catmull-Rom reaches 2 source pixels on each side).
    sd::Image halves = solid(16, 8, 0, 0, 0);
    for (int y = 0; y < 8; ++y)
        for (int x = 8; x < 16; ++x) std::fill_n(&halves.rgb[(static_cast<size_t>(y) * 16 + x) * 3], 3, uint8_t{255});
    const auto big = sd::fit_image(halves, 64, 24, sd::ResizeMode::Just);
    ASSERT_EQ(big.width, 64);
    ASSERT_EQ(big.height, 24);
    int changed_near_edge = 0;
    for (int y = 0; y < 24; ++y)
        for (int x = 0; x < 64; ++x) {
            const uint8_t v = px(big, x, y)[0];
            if (x < 24) ASSERT_EQ(v, 0) << x;
            else if (x >= 40) ASSERT_EQ(v, 255) << x;
            else changed_near_edge += v != 0 && v != 255;
        }
    EXPECT_GT(changed_near_edge, 0);
    // A flat picture stays flat at any size.
    const auto flat = sd::resize_image(solid(7, 5, 10, 200, 77), 30, 11);
    for (int i = 0; i < 30 * 11; ++i) ASSERT_TRUE(flat.rgb[i * 3] == 10 && flat.rgb[i * 3 + 1] == 200 && flat.rgb[i * 3 + 2] == 77);
}

TEST(ResizeModes, AMaskStaysAlignedWithItsPicture) {
    const auto src = coded(37, 23);
    sd::GreyImage red{37, 23, {}};
    for (int i = 0; i < 37 * 23; ++i) red.v.push_back(src.rgb[static_cast<size_t>(i) * 3]);
    for (auto mode : {sd::ResizeMode::Just, sd::ResizeMode::Crop, sd::ResizeMode::Fill}) {
        SCOPED_TRACE(sd::resize_mode_name(mode));
        const auto img = sd::fit_image(src, 48, 32, mode);
        const auto mask = sd::fit_grey(red, 48, 32, mode);
        ASSERT_EQ(mask.v.size(), 48u * 32u);
        for (size_t i = 0; i < mask.v.size(); ++i) ASSERT_EQ(mask.v[i], img.rgb[i * 3]) << i;
    }
}

TEST(ResizeModes, NamesAndMultiples) {
    EXPECT_EQ(sd::parse_resize_mode("crop", "--resize-mode"), sd::ResizeMode::Crop);
    EXPECT_EQ(error_of([] { sd::parse_resize_mode("stretch", "--resize-mode"); }),
              "--resize-mode: unknown resize mode 'stretch' (choose just, crop or fill)");
    EXPECT_EQ(sd::round_down_to_multiple(100, 32), 96);
    EXPECT_EQ(sd::round_down_to_multiple(100, 8), 96);
    EXPECT_EQ(sd::round_down_to_multiple(97, 8), 96);
    EXPECT_EQ(sd::round_down_to_multiple(64, 32), 64);
    EXPECT_EQ(sd::round_down_to_multiple(31, 32), 0);
}

// --- outpaint ---

TEST(Outpaint, ParsesFourMarginsAndRefusesTheRest) {
    const auto m = sd::parse_outpaint("8,0,16,64", "--outpaint");
    EXPECT_EQ(m.left, 8);
    EXPECT_EQ(m.top, 0);
    EXPECT_EQ(m.right, 16);
    EXPECT_EQ(m.bottom, 64);
    for (const char* bad : {"", "1,2,3", "1,2,3,4,5", "a,b,c,d", "-1,0,0,0", "1, 2,3,4", "1,,3,4", "1.5,0,0,0", "+1,0,0,0"})
        EXPECT_EQ(error_of([&] { sd::parse_outpaint(bad, "--outpaint"); }),
                  std::string("--outpaint: expected four whole numbers LEFT,TOP,RIGHT,BOTTOM, got '") + bad + "'");
    EXPECT_NE(error_of([] { sd::parse_outpaint("0,0,0,0", "--outpaint"); }).find("nothing to outpaint"), std::string::npos);
    EXPECT_NE(error_of([] { sd::parse_outpaint("16385,0,0,0", "--outpaint"); }).find("more than the 16384"),
              std::string::npos);
    EXPECT_NE(error_of([] { sd::parse_outpaint("99999999999,0,0,0", "--outpaint"); }).find("--outpaint: "),
              std::string::npos);
}

TEST(Outpaint, CanvasKeepsThePictureAndMasksOnlyTheNewArea) {
    const auto src = coded(6, 4);
    const auto c = sd::outpaint_canvas(src, {2, 1, 3, 0}, sd::MaskedContent::Original, "--outpaint");
    ASSERT_EQ(c.image.width, 11);
    ASSERT_EQ(c.image.height, 5);
    ASSERT_EQ(c.mask.width, 11);
    ASSERT_EQ(c.mask.height, 5);
    int kept = 0, added = 0;
    for (int y = 0; y < 5; ++y)
        for (int x = 0; x < 11; ++x) {
            const bool inside = x >= 2 && x < 8 && y >= 1;
            const uint8_t m = c.mask.v[static_cast<size_t>(y) * 11 + x];
            if (inside) {
                ASSERT_EQ(m, 0);
                ASSERT_TRUE(same_px(c.image, x, y, src, x - 2, y - 1));
                ++kept;
            } else {
                ASSERT_EQ(m, 255);
                ASSERT_TRUE(px(c.image, x, y)[0] == 0 && px(c.image, x, y)[1] == 0 && px(c.image, x, y)[2] == 0);
                ++added;
            }
        }
    EXPECT_EQ(kept, 24);
    EXPECT_EQ(added, 55 - 24);
    EXPECT_NE(error_of([&] { sd::outpaint_canvas(src, {16380, 0, 0, 0}, sd::MaskedContent::Original, "--outpaint"); })
                  .find("16386x4 pixels; sides up to 16384"),
              std::string::npos);
}

TEST(Outpaint, FillColoursTheNewAreaFromTheNearestPicturePixels) {
    // Left half red, right half blue, extended 12 pixels on each side.
    sd::Image src = solid(16, 8, 255, 0, 0);
    for (int y = 0; y < 8; ++y)
        for (int x = 8; x < 16; ++x) {
            uint8_t* p = &src.rgb[(static_cast<size_t>(y) * 16 + x) * 3];
            p[0] = 0, p[2] = 255;
        }
    const auto c = sd::outpaint_canvas(src, {12, 4, 12, 4}, sd::MaskedContent::Fill, "--outpaint");
    ASSERT_EQ(c.image.width, 40);
    ASSERT_EQ(c.image.height, 16);
    for (int y = 0; y < 16; ++y)
        for (int x = 0; x < 40; ++x) {
            const uint8_t* p = px(c.image, x, y);
            if (x >= 12 && x < 28 && y >= 4 && y < 12) {
                ASSERT_TRUE(same_px(c.image, x, y, src, x - 12, y - 4));  // kept exactly
            } else if (x < 12) {
                ASSERT_GT(p[0], p[2]) << x << "," << y;  // the red side fills reddish
                if (x == 11 && y >= 4 && y < 12) ASSERT_GT(p[0], p[2] + 100) << y;  // next to red: red
            } else if (x >= 28) {
                ASSERT_GT(p[2], p[0]) << x << "," << y;
                if (x == 28 && y >= 4 && y < 12) ASSERT_GT(p[2], p[0] + 100) << y;
            }
            ASSERT_EQ(p[1], 0);  // no colour that is not in the picture
        }
    // A flat picture fills flat.
    const auto flat = sd::outpaint_canvas(solid(8, 8, 30, 140, 220), {8, 8, 8, 8}, sd::MaskedContent::Fill, "o");
    for (int i = 0; i < 24 * 24; ++i)
        ASSERT_TRUE(std::abs(flat.image.rgb[i * 3] - 30) <= 1 && std::abs(flat.image.rgb[i * 3 + 1] - 140) <= 1 &&
                    std::abs(flat.image.rgb[i * 3 + 2] - 220) <= 1)
            << i;
}

TEST(Outpaint, MaskedContentNames) {
    EXPECT_EQ(sd::parse_masked_content("latent-noise", "--masked-content"), sd::MaskedContent::LatentNoise);
    EXPECT_TRUE(sd::is_pixel_fill(sd::MaskedContent::Fill));
    EXPECT_FALSE(sd::is_pixel_fill(sd::MaskedContent::LatentNothing));
    EXPECT_NE(error_of([] { sd::parse_masked_content("noise", "--masked-content"); }).find("unknown masked content"),
              std::string::npos);
}

// --- masks ---

sd::GreyImage block_mask(int w, int h, int x0, int y0, int x1, int y1) {
    sd::GreyImage m{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h, 0)};
    for (int y = y0; y < y1; ++y)
        for (int x = x0; x < x1; ++x) m.v[static_cast<size_t>(y) * w + x] = 255;
    return m;
}

TEST(MaskBlur, KernelSizeIsA1111s) {
    EXPECT_EQ(sd::mask_blur_kernel_size(1), 7);
    EXPECT_EQ(sd::mask_blur_kernel_size(4), 21);
    EXPECT_EQ(sd::mask_blur_kernel_size(64), 321);
}

TEST(MaskBlur, ChangesOnlyPixelsWithinHalfAKernelOfTheEdge) {
    const int r = 4, half = (sd::mask_blur_kernel_size(r) - 1) / 2;  // 10
    const auto mask = block_mask(64, 48, 20, 15, 40, 30);
    const auto blurred = sd::blur_mask(mask, r);
    int changed = 0;
    for (int y = 0; y < 48; ++y)
        for (int x = 0; x < 64; ++x) {
            const int dx = x < 20 ? 20 - x : x >= 40 ? x - 39 : 0, dy = y < 15 ? 15 - y : y >= 30 ? y - 29 : 0;
            const uint8_t before = mask.v[static_cast<size_t>(y) * 64 + x], after = blurred.v[static_cast<size_t>(y) * 64 + x];
            if (dx > half || dy > half) ASSERT_EQ(after, 0) << x << "," << y;  // out of reach
            // Inside, farther than half a kernel from every edge: untouched.
            if (x >= 20 + half && x < 40 - half && y >= 15 + half && y < 30 - half) ASSERT_EQ(after, 255);
            changed += before != after;
        }
    EXPECT_GT(changed, 0);
    // The pixels next to a straight edge: outside below 128, inside above, so
    // the binarised mask keeps its edges (away from the corners).
    for (int y = 20; y < 25; ++y) {
        EXPECT_LT(blurred.v[static_cast<size_t>(y) * 64 + 19], 128);
        EXPECT_GT(blurred.v[static_cast<size_t>(y) * 64 + 20], 127);
        EXPECT_GT(blurred.v[static_cast<size_t>(y) * 64 + 19], 0);
        EXPECT_LT(blurred.v[static_cast<size_t>(y) * 64 + 20], 255);
    }
    EXPECT_EQ(sd::blur_mask(mask, 0).v, mask.v);
}

TEST(MaskBlur, RowsFirstThenColumnsEachRoundedToEightBits) {
    // One white pixel, radius 1 (7 taps): the centre becomes
    // round(round(255 w0) w0) with w0 the kernel's middle weight.
    auto m = block_mask(15, 15, 7, 7, 8, 8);
    double sum = 0;
    for (int i = -3; i <= 3; ++i) sum += std::exp(-i * i / 2.0);
    const double w0 = 1 / sum, w1 = std::exp(-0.5) / sum;
    const auto b = sd::blur_mask(m, 1);
    EXPECT_EQ(b.v[7 * 15 + 7], std::lrint(std::lrint(255 * w0) * w0));
    EXPECT_EQ(b.v[7 * 15 + 8], std::lrint(std::lrint(255 * w1) * w0));
    EXPECT_EQ(b.v[8 * 15 + 7], std::lrint(std::lrint(255 * w0) * w1));
    // Mirror-symmetric.
    for (int y = 0; y < 15; ++y)
        for (int x = 0; x < 15; ++x) ASSERT_EQ(b.v[static_cast<size_t>(y) * 15 + x], b.v[static_cast<size_t>(y) * 15 + 14 - x]);
    // At the border the image is mirrored without repeating the edge pixel (reflect 101):
    // a white left column blurs as a 1-pixel line would, mirrored.
    const auto edge = sd::blur_mask(block_mask(9, 3, 0, 0, 1, 3), 1);
    EXPECT_EQ(edge.v[0], std::lrint(255 * w0));
    EXPECT_EQ(edge.v[1], std::lrint(255 * w1));
}

TEST(MaskBlur, InvertThenBinarise) {
    sd::GreyImage m{4, 1, {0, 127, 128, 255}};
    EXPECT_EQ(sd::invert_mask(m).v, std::vector<uint8_t>({255, 128, 127, 0}));
    EXPECT_EQ(sd::binarize_mask(m), std::vector<float>({0, 0, 1, 1}));
    EXPECT_EQ(sd::binarize_mask(sd::invert_mask(m)), std::vector<float>({1, 1, 0, 0}));
}

TEST(MaskProcessing, MaskSizeMustMatchThePicture) {
    EXPECT_EQ(error_of([] { sd::check_mask_size(sd::GreyImage{64, 32, {}}, 64, 64, "--mask m.png"); }),
              "--mask m.png: the mask is 64x32 but the picture is 64x64; they must be the same size");
    EXPECT_EQ(error_of([] { sd::check_mask_size(sd::GreyImage{64, 64, {}}, 64, 64, "--mask m.png"); }), "");
}

TEST(MaskProcessing, LatentMaskTakesTheTopLeftPixelOfEachBlock) {
    std::vector<float> m(16 * 8, 0.0f);
    m[0] = 1;           // (0, 0) -> latent (0, 0)
    m[8] = 1;           // (8, 0) -> latent (1, 0)
    m[1 * 16 + 1] = 1;  // inside block (0, 0), not its corner: ignored
    const auto l = sd::latent_mask(m, 16, 8, 8);
    EXPECT_EQ(l, std::vector<float>({1, 1}));
    EXPECT_NE(error_of([&] { sd::latent_mask(m, 16, 8, 3); }), "");
}

TEST(MaskProcessing, PasteBackKeepsTheOriginalWhereTheMaskIsZero) {
    const auto orig = solid(3, 1, 10, 20, 30), gen = solid(3, 1, 250, 120, 0);
    const sd::GreyImage m{3, 1, {0, 128, 255}};
    const auto out = sd::paste_back(orig, gen, m);
    EXPECT_EQ(std::vector<uint8_t>(out.rgb.begin(), out.rgb.begin() + 3), std::vector<uint8_t>({10, 20, 30}));
    EXPECT_EQ(std::vector<uint8_t>(out.rgb.begin() + 6, out.rgb.end()), std::vector<uint8_t>({250, 120, 0}));
    // (250 * 128 + 10 * 127 + 127) / 255 = 130
    EXPECT_EQ(out.rgb[3], 130);
}

std::vector<float> floats(const sd::NpyArray& a) { return std::vector<float>(a.as<float>(), a.as<float>() + a.numel()); }

// The inpaint cases' preprocessing, from the PNGs: bit-exact.
TEST(MaskProcessing, InpaintCasesPreprocessingIsExact) {
    int checked = 0;
    for (const auto& c : sdtest::inpaint_picture_cases()) {
        const sd::Image& img = c.picture;
        const sd::GreyImage& mask = c.mask;
        const fs::path e = c.dir;
        SCOPED_TRACE(c.dir);
        sd::check_mask_size(mask, img.width, img.height, "--mask");
        const auto chw = sd::image_to_chw(img);
        EXPECT_EQ(chw, floats(sd::read_npy((e / "init_image.npy").string())));
        const auto bin = sd::binarize_mask(mask);
        EXPECT_EQ(bin, floats(sd::read_npy((e / "mask.npy").string())));
        EXPECT_EQ(sd::masked_image_chw(chw, bin), floats(sd::read_npy((e / "masked_image.npy").string())));
        const auto lat = floats(sd::read_npy((e / "mask_latent.npy").string()));  // [n, 1, h, w]
        const auto mine = sd::latent_mask(bin, img.width, img.height, 8);
        ASSERT_EQ(lat.size() % mine.size(), 0u);
        for (size_t k = 0; k < lat.size(); k += mine.size())
            EXPECT_EQ(std::vector<float>(lat.begin() + static_cast<long>(k), lat.begin() + static_cast<long>(k + mine.size())), mine);
        ++checked;
    }
    EXPECT_EQ(checked, 6);
}

TEST(MaskProcessing, Img2ImgCasesInitImageIsExact) {
    const fs::path root = fs::path(sdtest::env("SD_SHARED_CONFORMANCE")) / "img2img" / "cases";
    int checked = 0;
    for (const auto& e : fs::directory_iterator(root)) {
        if (!fs::exists(e.path() / "init.png")) continue;
        SCOPED_TRACE(e.path().string());
        const auto chw = sd::image_to_chw(sd::read_image((e.path() / "init.png").string(), "--init-img"));
        const auto ref = floats(sd::read_npy((e.path() / "init_image.npy").string()));  // [1 or n, 3, H, W]
        ASSERT_EQ(ref.size() % chw.size(), 0u);
        EXPECT_EQ(std::vector<float>(ref.begin(), ref.begin() + static_cast<long>(chw.size())), chw);
        ++checked;
    }
    EXPECT_EQ(checked, 8);
}

}  // namespace
