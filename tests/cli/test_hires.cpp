// The hires fix through the CLI (issue 33): a hires run equals, pixel for
// pixel, the txt2img run at the first size, the lanczos upscale of its PNG
// (image/lanczos.h, the tool's own) and a separate --init-img run at the hires
// size with the same seed, sampler and prompt; the PNG text in A1111's names;
// --from-png remaking a hires PNG byte for byte; what is refused. The latent
// upscalers' equivalent is in test_hires_latents.cpp (through the library).
#include <gtest/gtest.h>

#include "image/lanczos.h"
#include "io/image_io.h"
#include "test_util.h"

namespace {

std::vector<std::string> base_args(const std::string& outdir, const std::string& sampler) {
    return {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", outdir, "--quiet", "--threads",
            "1",           "--prompt", "a red circle on a blue background", "--seed", "11", "--scale", "5",
            "--sampler",   sampler};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
}

void run_ok(const std::vector<std::string>& args) {
    const auto r = sdtest::run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
}

struct HiresLanczos : ::testing::TestWithParam<std::string> {};

// ddim: CompVis img2img.py's arithmetic in the second pass; euler: diffusers'.
TEST_P(HiresLanczos, EqualsTxt2ImgUpscaleAndImg2Img) {
    const std::string sampler = GetParam(), out = sdtest::temp_dir();
    run_ok(with(base_args(out + "/hires", sampler),
                {"--W", "64", "--H", "48", "--steps", "6", "--hires-scale", "2", "--hires-steps", "5",
                 "--hires-strength", "0.6", "--hires-upscaler", "lanczos"}));
    run_ok(with(base_args(out + "/first", sampler), {"--W", "64", "--H", "48", "--steps", "6"}));
    const sd::Image first = sd::read_png(out + "/first/00000.png");
    ASSERT_EQ(first.width, 64);
    const sd::Image up = sd::lanczos_resize(first, 128, 96);
    ASSERT_TRUE(sd::save_png_new(out + "/up.png", up));
    run_ok(with(base_args(out + "/second", sampler), {"--W", "128", "--H", "96", "--steps", "5", "--strength", "0.6",
                                                      "--init-img", out + "/up.png"}));
    const sd::Image hires = sd::read_png(out + "/hires/00000.png"), second = sd::read_png(out + "/second/00000.png");
    ASSERT_EQ(hires.width, 128);
    ASSERT_EQ(hires.height, 96);
    EXPECT_TRUE(hires.rgb == second.rgb) << "the hires image differs from txt2img + lanczos + img2img";
    EXPECT_FALSE(hires.rgb == up.rgb) << "the second pass changed nothing";
    const std::string text = sdtest::read_text(out + "/hires/00000.png");
    EXPECT_NE(text.find("Size: 64x48"), std::string::npos);
    EXPECT_NE(text.find("Denoising strength: 0.6, Hires upscale: 2, Hires steps: 5, Hires upscaler: Lanczos"),
              std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Samplers, HiresLanczos, ::testing::Values("ddim", "euler"));

// A hires PNG remade from its text alone: the same file, byte for byte
// (--hires-size, so "Hires resize" is read back too; default steps).
TEST(HiresRemake, FromPngRemakesTheFile) {
    const std::string out = sdtest::temp_dir();
    run_ok(with(base_args(out + "/a", "euler_a"),
                {"--W", "48", "--H", "48", "--steps", "4", "--hires-size", "80x64", "--hires-strength", "0.55",
                 "--hires-upscaler", "latent-nearest"}));
    const std::string png = out + "/a/00000.png";
    const std::string text = sdtest::read_text(png);
    EXPECT_NE(text.find("Denoising strength: 0.55, Hires resize: 80x64, Hires upscaler: Latent (nearest)"),
              std::string::npos);
    EXPECT_EQ(text.find("Hires steps"), std::string::npos);  // A1111 writes it only when set
    EXPECT_EQ(sd::read_png(png).width, 80);
    const auto r = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out + "/b",
                                "--quiet", "--threads", "1", "--from-png", png});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(sdtest::read_text(out + "/b/00000.png"), text);
}

TEST(HiresRefusals, OneLineEach) {
    const std::string out = sdtest::temp_dir(), st = sdtest::test_models() + "/tiny-st";
    const std::string pic = sdtest::fixtures() + "/../data/pictures/grey1.png";
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--hires-scale", "2", "--hires-upscaler", "bicubic"}, "--hires-upscaler"},
        {{"--hires-scale", "2", "--hires-size", "128x128"}, "one of --hires-scale"},
        {{"--hires-scale", "0.1"}, "hires fix's width"},
        {{"--hires-size", "100x128"}, "hires fix's width"},
        {{"--hires-scale", "2", "--hires-strength", "0"}, "--hires-strength"},
        {{"--hires-scale", "2", "--hires-steps", "-1"}, "--hires-steps"},
        {{"--hires-scale", "2", "--sampler", "plms"}, "plms"},
        {{"--hires-size", "12"}, "--hires-size"},
        {{"--hires-scale", "2", "--init-img", pic}, "--init-img"},
    };
    for (const auto& [extra, needle] : cases) {
        auto args = with({sdtest::cli(), "--model", st, "--outdir", out + "/x", "--prompt", "a", "--steps", "2", "--W",
                          "64", "--H", "64"},
                         extra);
        const auto r = sdtest::run(args);
        EXPECT_EQ(r.exit_code, 1) << extra[0] << " " << extra[1] << ": " << r.err;
        EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
        EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    }
}

}  // namespace

// --plan shows the encoder stage where a batch encodes (--init-img, the
// lanczos hires pass), and a hires plan is that of its larger canvas.
TEST(HiresPlan, EncoderStageAndTheLargerCanvas) {
    const std::string out = sdtest::temp_dir(), st = sdtest::test_models() + "/tiny-st";
    auto plan = [&](const std::vector<std::string>& extra) {
        const auto r = sdtest::run(with({sdtest::cli(), "--model", st, "--outdir", out, "--prompt", "a", "--steps",
                                         "4", "--sampler", "euler", "--plan", "--max-memory", "8G"},
                                        extra));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.out + r.err;
    };
    // The UNet's weights, activations and scores (its stage peak adds the process's own size, which varies).
    auto unet_row = [](const std::string& text) {
        const size_t at = text.find("unet        :");
        return at == std::string::npos ? std::string() : text.substr(at, text.find(", stage peak", at) - at);
    };
    const std::string pic = sdtest::fixtures() + "/../data/pictures/grey1.png";
    EXPECT_NE(plan({"--W", "64", "--H", "64", "--init-img", pic}).find("vae encoder :"), std::string::npos);
    const std::string txt = plan({"--W", "64", "--H", "64"});
    EXPECT_EQ(txt.find("vae encoder :"), std::string::npos) << txt;
    const std::string lanczos = plan({"--W", "64", "--H", "64", "--hires-scale", "2", "--hires-upscaler", "lanczos"});
    EXPECT_NE(lanczos.find("vae encoder :"), std::string::npos) << lanczos;
    const std::string latent = plan({"--W", "64", "--H", "64", "--hires-scale", "2"});
    EXPECT_EQ(latent.find("vae encoder :"), std::string::npos) << latent;
    const std::string big = plan({"--W", "128", "--H", "128"});
    EXPECT_FALSE(unet_row(big).empty()) << big;
    EXPECT_EQ(unet_row(latent), unet_row(big));
    EXPECT_NE(unet_row(txt), unet_row(big));
}

// JSON lines carry their own hires fix; lines with other hires settings are other batches.
TEST(HiresJsonLines, EachLineItsOwn) {
    const std::string out = sdtest::temp_dir(), st = sdtest::test_models() + "/tiny-st";
    sdtest::write_text(out + "/p.jsonl",
                       "{\"prompt\": \"a\", \"hires_scale\": 2, \"hires_upscaler\": \"lanczos\", \"hires_steps\": 3, "
                       "\"hires_strength\": 0.4}\n{\"prompt\": \"b\"}\n");
    const auto r = sdtest::run({sdtest::cli(), "--model", st, "--outdir", out + "/o", "--quiet", "--threads", "1",
                                "--steps", "3", "--sampler", "euler", "--W", "64", "--H", "64", "--from-file",
                                out + "/p.jsonl"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(sd::read_png(out + "/o/00000.png").width, 128);
    EXPECT_EQ(sd::read_png(out + "/o/00001.png").width, 64);
    const std::string text = sdtest::read_text(out + "/o/00000.png");
    EXPECT_NE(text.find("Denoising strength: 0.4, Hires upscale: 2, Hires steps: 3, Hires upscaler: Lanczos"),
              std::string::npos);
    EXPECT_EQ(sdtest::read_text(out + "/o/00001.png").find("Hires"), std::string::npos);
    sdtest::write_text(out + "/bad.jsonl", "{\"prompt\": \"a\", \"hires_upscaler\": \"bicubic\"}\n");
    const auto bad = sdtest::run({sdtest::cli(), "--model", st, "--outdir", out + "/x", "--from-file",
                                  out + "/bad.jsonl"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("bad.jsonl:1"), std::string::npos) << bad.err;
}
