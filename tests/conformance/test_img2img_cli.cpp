// Starting from a picture through the CLI (issue 33): every public case of the
// shared img2img/ (CompVis img2img.py, diffusers' img2img pipeline) and
// inpaint/ (diffusers' inpaint pipeline, 9- and 4-channel UNets) sets, with
// their READMEs' criteria (latents 1e-4 x max|ref|, images 1 level on at most
// 0.1% of values); remaking from the PNG; what is refused.
#include <gtest/gtest.h>

#include <filesystem>

#include "conformance_util.h"
#include "image/mask.h"
#include "io/image_io.h"
#include "io/image_reader.h"
#include "reference_case.h"
#include "test_util.h"

namespace {

std::string shared() { return sdtest::env("SD_SHARED_CONFORMANCE"); }

std::vector<std::string> case_names(const std::string& set) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(shared() + "/" + set + "/cases"))
        if (e.is_directory()) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// The case's CLI fields as this tool's flags: CompVis DDIM is ddim with the
// default schedule; diffusers' schedulers are named with their own spacing
// ("leading"), or karras.
// args.json as Python's json wrote it: its -Infinity and NaN (DPM++'s
// log-sigmas) are no JSON, so they are made numbers before parsing.
nlohmann::json read_case_args(const std::string& dir) {
    std::string text = sdtest::read_text(dir + "/args.json");
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"-Infinity", "-1e308"}, {"Infinity", "1e308"}, {"NaN", "null"}})
        for (size_t at = 0; (at = text.find(from, at)) != std::string::npos;) text.replace(at, from.size(), to);
    return nlohmann::json::parse(text);
}

std::vector<std::string> picture_case_args(const std::string& dir, const std::string& out) {
    const auto c = read_case_args(dir).at("cli");
    const std::string s = c.at("scheduler");
    const bool karras = c.value("karras", false);
    const auto [sampler, schedule] =
        s == "ddim"                            ? std::pair{"ddim", "default"}
        : s == "DDIMScheduler"                 ? std::pair{"ddim", "leading"}
        : s == "EulerAncestralDiscreteScheduler" ? std::pair{"euler_a", "leading"}
        : s == "DPMSolverMultistepScheduler"   ? std::pair{"dpmpp_2m", karras ? "karras" : "leading"}
                                               : std::pair{"lcm", "default"};
    const bool inpaint_model = c.at("model").get<std::string>().find("inpaint") != std::string::npos;
    char strength[32], scale[32];
    std::snprintf(strength, sizeof strength, "%.17g", c.at("strength").get<double>());
    std::snprintf(scale, sizeof scale, "%g", c.at("cfg_scale").get<double>());
    std::vector<std::string> args = {sdtest::cli(), "--model", sdtest::test_models() + (inpaint_model ? "/tiny-inpaint" : "/tiny-st"),
                                     "--outdir", out + "/img", "--quiet", "--threads", "1",
                                     "--prompt", c.at("prompt"), "--seed", std::to_string(c.at("seed").get<long long>()),
                                     "--W", std::to_string(c.at("width").get<int>()), "--H", std::to_string(c.at("height").get<int>()),
                                     "--steps", std::to_string(c.at("steps").get<int>()), "--scale", scale,
                                     "--sampler", sampler, "--schedule", schedule, "--strength", strength,
                                     "--n_samples", std::to_string(c.at("batch").get<int>()), "--init-img", dir + "/init.png"};
    if (!c.value("negative_prompt", std::string()).empty()) args.insert(args.end(), {"--negative-prompt", c["negative_prompt"]});
    if (c.contains("mask") && c["mask"].is_string()) args.insert(args.end(), {"--mask", dir + "/" + c["mask"].get<std::string>()});
    return args;
}

struct Img2ImgCli : ::testing::TestWithParam<std::string> {};

TEST_P(Img2ImgCli, MatchesTheReference) {
    const std::string dir = shared() + "/" + GetParam();
    const std::string out = sdtest::temp_dir();
    sdtest::check_cli_run(dir, picture_case_args(dir, out), out);
}

std::vector<std::string> all_cases() {
    std::vector<std::string> v;
    for (const auto* set : {"img2img", "inpaint"})
        for (const auto& n : case_names(set)) v.push_back(std::string(set) + "/cases/" + n);
    return v;
}

INSTANTIATE_TEST_SUITE_P(Public, Img2ImgCli, ::testing::ValuesIn(all_cases()), [](const auto& info) {
    std::string n = info.param;
    for (auto& ch : n)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return n;
});

// The two conventions differ on purpose (the README's "must fail" rows): the
// CompVis case run with diffusers' arithmetic (--schedule leading) must not match it.
TEST(Img2ImgCliConvention, CompVisCaseFailsUnderDiffusersArithmetic) {
    const std::string dir = shared() + "/img2img/cases/cv_ddim10_s0.75_64x64";
    const std::string out = sdtest::temp_dir();
    auto args = picture_case_args(dir, out);
    for (size_t i = 0; i + 1 < args.size(); ++i)
        if (args[i] == "--schedule") args[i + 1] = "leading";
    args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
    auto r = sdtest::run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(sdtest::latents_relative_error(dir, out + "/latents.npy"), 1e-2);
}

// A PNG made from a picture is remade byte for byte given the picture again,
// and refused with one line without it.
TEST(Img2ImgCliRemake, FromPngNeedsThePictureAndRemakesTheImage) {
    const std::string dir = shared() + "/inpaint/cases/i4_euler_a12_s0.75_soft_64x96";
    const std::string out = sdtest::temp_dir();
    auto first = sdtest::run(picture_case_args(dir, out));
    ASSERT_EQ(first.exit_code, 0) << first.err;
    const std::string png = sdtest::lines(first.out).at(0);
    const std::string params = sdtest::read_text(png);
    EXPECT_NE(params.find("Denoising strength: 0.75"), std::string::npos);
    EXPECT_NE(params.find("Mask hash: "), std::string::npos);

    auto refused = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out + "/again",
                                "--from-png", png});
    EXPECT_EQ(refused.exit_code, 1);
    EXPECT_NE(refused.err.find("--init-img FILE and its mask with --mask FILE"), std::string::npos) << refused.err;
    EXPECT_EQ(sdtest::lines(refused.err).size(), 1u) << refused.err;

    auto again = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out + "/again",
                              "--quiet", "--threads", "1", "--from-png", png, "--init-img", dir + "/init.png", "--mask",
                              dir + "/mask.png"});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(again.err.find("warning"), std::string::npos) << again.err;
    EXPECT_EQ(sd::read_png(png).rgb, sd::read_png(sdtest::lines(again.out).at(0)).rgb);

    // Another picture: a warning, and another image.
    auto other = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out + "/other",
                              "--quiet", "--threads", "1", "--from-png", png, "--init-img",
                              shared() + "/img2img/cases/d_euler_a20_s0.5_64x96/init.png", "--mask", dir + "/mask.png"});
    ASSERT_EQ(other.exit_code, 0) << other.err;
    EXPECT_EQ(sdtest::lines(other.err).size(), 1u) << other.err;
    EXPECT_NE(other.err.find("was made from another picture than --init-img"), std::string::npos) << other.err;
    EXPECT_NE(sd::read_png(png).rgb, sd::read_png(sdtest::lines(other.out).at(0)).rgb);
}

TEST(Img2ImgCliRefusals, OneLineEach) {
    const std::string out = sdtest::temp_dir();
    const std::string init = shared() + "/img2img/cases/cv_ddim10_s0.75_64x64/init.png";
    auto refused = [&](std::vector<std::string> extra, const std::string& model, const std::string& expect) {
        std::vector<std::string> args = {sdtest::cli(), "--model", model, "--outdir", out + "/img", "--prompt", "a", "--steps", "2"};
        args.insert(args.end(), extra.begin(), extra.end());
        auto r = sdtest::run(args);
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
        EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
        EXPECT_FALSE(std::filesystem::exists(out + "/img/00000.png"));
    };
    const std::string st = sdtest::test_models() + "/tiny-st";
    refused({"--init-img", init, "--sampler", "plms"}, st, "another sampler than plms");
    // Without --sampler a picture runs CompVis img2img.py's DDIM, not the default PLMS.
    auto ddim = sdtest::run({sdtest::cli(), "--model", st, "--outdir", out + "/ddim", "--prompt", "a", "--steps", "2",
                             "--init-img", init, "--quiet"});
    ASSERT_EQ(ddim.exit_code, 0) << ddim.err;
    EXPECT_NE(sdtest::read_text(sdtest::lines(ddim.out).at(0)).find("Sampler: DDIM"), std::string::npos);
    refused({"--init-img", init, "--strength", "0", "--sampler", "ddim"}, st, "--strength");
    refused({"--init-img", init, "--strength", "1.5", "--sampler", "ddim"}, st, "--strength");
    refused({"--mask", init, "--sampler", "ddim"}, st, "--mask needs --init-img");
    refused({"--init-img", out + "/none.png", "--sampler", "ddim"}, st, "does not exist");
    refused({"--init-img", "/dev/zero", "--sampler", "ddim"}, st, "is a device");
    refused({"--sampler", "ddim"}, sdtest::test_models() + "/tiny-inpaint", "is an inpainting model");
    // A folder exported before img2img (no encoder): one line saying to export it again; txt2img still runs.
    const std::string old = out + "/old-model";
    std::filesystem::copy(st, old);
    auto info = sdtest::read_json(old + "/model.json");
    info["files"].erase("vae_encoder");
    sdtest::write_text(old + "/model.json", info.dump());
    refused({"--init-img", init, "--sampler", "ddim"}, old, "has no VAE encoder");
    auto txt = sdtest::run({sdtest::cli(), "--model", old, "--outdir", out + "/txt", "--prompt", "a", "--steps", "2",
                            "--H", "64", "--W", "64", "--quiet"});
    EXPECT_EQ(txt.exit_code, 0) << txt.err;
}

// The canvas: --outpaint grows it by its margins, --resize-mode brings another
// size to --W x --H, and a prompt file's line carries its own picture and strength.
TEST(Img2ImgCliCanvas, OutpaintResizeModesAndJsonLines) {
    const std::string out = sdtest::temp_dir();
    const std::string init = shared() + "/img2img/cases/cv_ddim10_s0.75_64x64/init.png";  // 64x64
    const std::string st = sdtest::test_models() + "/tiny-st";
    auto size_of = [&](std::vector<std::string> extra) {
        std::vector<std::string> args = {sdtest::cli(), "--model", st, "--outdir", out + "/img", "--quiet", "--prompt", "a",
                                         "--steps", "2", "--sampler", "ddim", "--schedule", "leading", "--init-img", init};
        args.insert(args.end(), extra.begin(), extra.end());
        auto r = sdtest::run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        if (r.exit_code != 0) return std::pair{0, 0};
        const auto img = sd::read_png(sdtest::lines(r.out).at(0));
        return std::pair{img.width, img.height};
    };
    EXPECT_EQ(size_of({}), (std::pair{64, 64}));                                  // the picture's own size
    EXPECT_EQ(size_of({"--outpaint", "0,0,32,16", "--strength", "1"}), (std::pair{96, 80}));
    EXPECT_EQ(size_of({"--outpaint", "16,0,0,0", "--masked-content", "fill"}), (std::pair{80, 64}));
    for (const char* mode : {"just", "crop", "fill"})
        EXPECT_EQ(size_of({"--W", "96", "--H", "64", "--resize-mode", mode}), (std::pair{96, 64})) << mode;

    sdtest::write_text(out + "/p.jsonl", "{\"prompt\": \"a\", \"init_img\": \"" + init + "\", \"strength\": 0.5}\n");
    auto r = sdtest::run({sdtest::cli(), "--model", st, "--outdir", out + "/jsonl", "--quiet", "--steps", "4", "--sampler",
                          "ddim", "--H", "64", "--W", "64", "--from-file", out + "/p.jsonl"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(sdtest::read_text(sdtest::lines(r.out).at(0)).find("Denoising strength: 0.5"), std::string::npos);
    sdtest::write_text(out + "/bad.jsonl", "{\"prompt\": \"a\", \"init_img\": \"" + init + "\", \"strength\": 2}\n");
    r = sdtest::run({sdtest::cli(), "--model", st, "--outdir", out + "/jsonl", "--from-file", out + "/bad.jsonl"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("bad.jsonl:1: \"strength\""), std::string::npos) << r.err;
}

// --mask-blur: A1111's overlay through the blurred mask. Pixels the soft mask
// keeps (0) are the picture's exactly; without a blur (the references) the kept
// area is the VAE's reconstruction, and repainted pixels differ from the picture.
TEST(Img2ImgCliCanvas, MaskBlurKeepsThePictureOutsideTheBlurredMask) {
    const std::string dir = shared() + "/inpaint/cases/i4_ddim10_s1.0_binary_64x64";
    const std::string out = sdtest::temp_dir();
    auto make = [&](const std::string& name, std::vector<std::string> extra) {
        std::vector<std::string> args = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir",
                                         out + "/" + name, "--quiet", "--prompt", "a boat", "--steps", "4",
                                         "--sampler", "ddim", "--schedule", "leading", "--init-img", dir + "/init.png",
                                         "--mask", dir + "/mask.png"};
        args.insert(args.end(), extra.begin(), extra.end());
        auto r = sdtest::run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.exit_code == 0 ? sd::read_png(sdtest::lines(r.out).at(0)) : sd::Image{};
    };
    const sd::Image picture = sd::read_image(dir + "/init.png", "--init-img");
    const sd::GreyImage soft = sd::blur_mask(sd::read_mask(dir + "/mask.png", "--mask"), 4);
    const sd::Image blurred = make("blur", {"--mask-blur", "4"}), plain = make("plain", {});
    ASSERT_EQ(blurred.rgb.size(), picture.rgb.size());
    ASSERT_EQ(plain.rgb.size(), picture.rgb.size());
    int kept = 0, kept_changed_plain = 0, repainted_changed = 0;
    for (size_t i = 0; i < soft.v.size(); ++i)
        for (int ch = 0; ch < 3; ++ch) {
            const size_t k = i * 3 + static_cast<size_t>(ch);
            if (soft.v[i] == 0) {
                ++kept;
                EXPECT_EQ(blurred.rgb[k], picture.rgb[k]) << "pixel " << i;
                kept_changed_plain += plain.rgb[k] != picture.rgb[k];
            } else if (soft.v[i] == 255) {
                repainted_changed += blurred.rgb[k] != picture.rgb[k];
            }
        }
    EXPECT_GT(kept, 0);
    EXPECT_GT(kept_changed_plain, 0);  // without the blur nothing is pasted back
    EXPECT_GT(repainted_changed, 0);
}

}  // namespace
