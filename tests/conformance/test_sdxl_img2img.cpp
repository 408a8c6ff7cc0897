// SDXL img2img and the hires fix on SDXL (issue 33), through the CLI on the
// tiny SDXL fixture. No reference run exists for SDXL img2img, so this checks
// what can be: sizes, determinism, that the picture matters, the UNet
// evaluations against txt2img's (all at strength 1, half at 0.5), the PNG
// text, and a hires run against txt2img + lanczos + a separate --init-img run
// (which also covers the second pass's size conditioning).
#include <gtest/gtest.h>

#include "image/lanczos.h"
#include "io/image_io.h"
#include "test_util.h"

namespace {

std::vector<std::string> sdxl_args(const std::string& outdir, const std::vector<std::string>& more) {
    std::vector<std::string> a = {sdtest::cli(), "--model", sdtest::test_models() + "/sdxl-st", "--outdir", outdir,
                                  "--threads", "1", "--prompt", "a red circle on a blue background", "--seed", "21",
                                  "--sampler", "euler", "--steps", "4", "--W", "64", "--H", "64"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
}

sdtest::CmdResult run_ok(const std::vector<std::string>& args) {
    auto r = sdtest::run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
}

int evaluations(const std::string& err) {
    const size_t at = err.find("sd-txt2img: unet: ");
    return at == std::string::npos ? -1 : std::stoi(err.substr(at + 18));
}

}  // namespace

TEST(SdxlImg2Img, RunsDeterministicallyFromThePicture) {
    const std::string out = sdtest::temp_dir();
    const auto txt = run_ok(sdxl_args(out + "/t", {"--verbose"}));
    const std::string init = out + "/t/00000.png";
    run_ok(sdxl_args(out + "/a", {"--quiet", "--init-img", init, "--strength", "0.5"}));
    run_ok(sdxl_args(out + "/b", {"--quiet", "--init-img", init, "--strength", "0.5"}));
    const std::string a = sdtest::read_text(out + "/a/00000.png");
    EXPECT_EQ(a, sdtest::read_text(out + "/b/00000.png"));
    const sd::Image img = sd::read_png(out + "/a/00000.png");
    EXPECT_EQ(img.width, 64);
    EXPECT_EQ(img.height, 64);
    EXPECT_NE(a.find("Denoising strength: 0.5, Init image hash: "), std::string::npos);
    // Another picture, another result.
    sd::Image other = sd::read_png(init);
    for (auto& v : other.rgb) v = static_cast<uint8_t>(255 - v);
    ASSERT_TRUE(sd::save_png_new(out + "/other.png", other));
    run_ok(sdxl_args(out + "/c", {"--quiet", "--init-img", out + "/other.png", "--strength", "0.5"}));
    EXPECT_FALSE(sd::read_png(out + "/c/00000.png").rgb == img.rgb);
    // The UNet runs every step at strength 1 and half of them at 0.5.
    const int all = evaluations(txt.err);
    EXPECT_EQ(all, 4) << txt.err;
    EXPECT_EQ(evaluations(run_ok(sdxl_args(out + "/d", {"--verbose", "--init-img", init, "--strength", "1"})).err), all);
    EXPECT_EQ(evaluations(run_ok(sdxl_args(out + "/e", {"--verbose", "--init-img", init, "--strength", "0.5"})).err),
              all / 2);
}

TEST(SdxlImg2Img, HiresEqualsTxt2ImgUpscaleAndImg2Img) {
    const std::string out = sdtest::temp_dir();
    run_ok(sdxl_args(out + "/h", {"--quiet", "--hires-scale", "2", "--hires-steps", "3", "--hires-strength", "0.7",
                                  "--hires-upscaler", "lanczos"}));
    run_ok(sdxl_args(out + "/t", {"--quiet"}));
    const sd::Image up = sd::lanczos_resize(sd::read_png(out + "/t/00000.png"), 128, 128);
    ASSERT_TRUE(sd::save_png_new(out + "/up.png", up));
    auto second = sdxl_args(out + "/s", {"--quiet", "--init-img", out + "/up.png", "--strength", "0.7"});
    for (size_t i = 0; i + 1 < second.size(); ++i) {
        if (second[i] == "--W" || second[i] == "--H") second[i + 1] = "128";
        if (second[i] == "--steps") second[i + 1] = "3";
    }
    run_ok(second);
    const sd::Image hires = sd::read_png(out + "/h/00000.png");
    EXPECT_EQ(hires.width, 128);
    EXPECT_TRUE(hires.rgb == sd::read_png(out + "/s/00000.png").rgb);
}
