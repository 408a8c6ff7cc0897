// The decoder options end to end (issue 19): --vae-decoder taesd:, --preview
// and --vae, on the tiny model, and their bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/image_io.h"
#include "test_util.h"

using sdtest::run;

namespace {

std::string tiny_model() { return sdtest::test_models() + "/tiny-st"; }
std::string taesd_tiny() { return "taesd:" + sdtest::fixtures() + "/taesd/taesd_tiny"; }

// A short run of the tiny model into `outdir` with extra flags.
sdtest::CmdResult run_tiny(const std::string& outdir, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {sdtest::cli(), "--model", tiny_model(), "--outdir", outdir, "--quiet",
                                     "--prompt", "a red fox", "--seed", "3", "--steps", "5", "--sampler", "ddim",
                                     "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
}

std::vector<uint8_t> pixels_of(const std::string& path) { return sd::read_png(path).rgb; }

std::vector<std::string> previews_on(const std::string& err) {
    const std::string head = "sd-txt2img: preview: ";
    std::vector<std::string> paths;
    for (const auto& l : sdtest::lines(err))
        if (l.rfind(head, 0) == 0) paths.push_back(l.substr(head.size()));
    return paths;
}

// The --json lines without their timing, with the output folder renamed.
std::vector<nlohmann::json> records(const std::string& out, const std::string& from, const std::string& to) {
    std::vector<nlohmann::json> v;
    for (auto line : sdtest::lines(out)) {
        for (size_t p = line.find(from); p != std::string::npos; p = line.find(from, p + to.size()))
            line.replace(p, from.size(), to);
        auto j = nlohmann::json::parse(line);
        j.erase("seconds");
        v.push_back(j);
    }
    return v;
}

// The one error line of a failed run.
void expect_one_line_error(const sdtest::CmdResult& r, const std::string& part) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace

// --preview 2 over 5 steps: steps 2 and 4, for each of the 2 images; their paths
// on stderr, PNGs of the image's size; stdout (--json) and the images as without it.
TEST(Preview, WritesEveryNStepsAndLeavesTheRunAlone) {
    const std::string a = sdtest::temp_dir(), b = sdtest::temp_dir();
    const std::vector<std::string> common = {"--vae-decoder", taesd_tiny(), "--n_samples", "2", "--json", "--W", "96"};
    auto base = run_tiny(a, common);
    ASSERT_EQ(base.exit_code, 0) << base.err;
    auto with = common;
    with.insert(with.end(), {"--preview", "2"});
    auto r = run_tiny(b, with);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto paths = previews_on(r.err);
    ASSERT_EQ(paths.size(), 4u) << r.err;
    for (const auto& p : paths) {
        EXPECT_EQ(p.rfind(b + "/previews/", 0), 0u) << p;
        const auto img = sd::read_png(p);
        EXPECT_EQ(img.width, 96);
        EXPECT_EQ(img.height, 64);
    }
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(b + "/previews")) files += e.path().extension() == ".png";
    EXPECT_EQ(files, 4);
    EXPECT_EQ(sdtest::lines(r.out).size(), 2u);
    EXPECT_EQ(records(r.out, b, b), records(base.out, a, b));
    for (const auto& name : {"/00000.png", "/00001.png"}) EXPECT_EQ(pixels_of(a + name), pixels_of(b + name)) << name;
}

// With the full VAE for the image, --preview-decoder gives the previews' TAESD.
TEST(Preview, PreviewDecoderBesideTheFullVae) {
    const std::string a = sdtest::temp_dir(), b = sdtest::temp_dir();
    auto base = run_tiny(a, {});
    ASSERT_EQ(base.exit_code, 0) << base.err;
    auto r = run_tiny(b, {"--preview", "3", "--preview-decoder", taesd_tiny()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(previews_on(r.err).size(), 1u) << r.err;
    EXPECT_EQ(pixels_of(a + "/00000.png"), pixels_of(b + "/00000.png"));
}

TEST(Preview, NeedsATaesd) {
    expect_one_line_error(run_tiny(sdtest::temp_dir(), {"--preview", "2"}), "--preview needs a TAESD decoder");
    expect_one_line_error(run_tiny(sdtest::temp_dir(), {"--preview", "-1", "--vae-decoder", taesd_tiny()}), "--preview");
}

// TAESD changes the image, and only the image: the latents are the full VAE run's.
TEST(VaeDecoder, TaesdReplacesOnlyTheDecoder) {
    const std::string a = sdtest::temp_dir(), b = sdtest::temp_dir();
    auto base = run_tiny(a, {"--save-latents", a + "/l.npy"});
    auto r = run_tiny(b, {"--vae-decoder", taesd_tiny(), "--save-latents", b + "/l.npy"});
    ASSERT_EQ(base.exit_code, 0) << base.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(sdtest::read_text(a + "/l.npy"), sdtest::read_text(b + "/l.npy"));
    EXPECT_NE(pixels_of(a + "/00000.png"), pixels_of(b + "/00000.png"));
}

TEST(VaeDecoder, BadInputIsOneLine) {
    const std::string dir = sdtest::temp_dir();
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "taesd:"}), "needs a path after 'taesd:'");
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "tiny.pth"}), "--vae-decoder takes taesd:FILE");
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "taesd:" + dir + "/none.pth"}), "none.pth does not exist");
    std::filesystem::create_directories(dir + "/folder");
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "taesd:" + dir + "/folder"}),
                          "has no diffusion_pytorch_model.safetensors");
    const std::string full =
        sdtest::read_text(sdtest::fixtures() + "/taesd/taesd_tiny/diffusion_pytorch_model.safetensors");
    sdtest::write_text(dir + "/cut.safetensors", full.substr(0, full.size() - 100));
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "taesd:" + dir + "/cut.safetensors"}), "cut.safetensors");
    expect_one_line_error(run_tiny(dir, {"--preview-decoder", "taesd:", "--preview", "1"}), "--preview-decoder");
    const std::string pth = sdtest::read_text(sdtest::fixtures() + "/taesd/taesd_decoder.pth");
    sdtest::write_text(dir + "/cut.pth", pth.substr(0, pth.size() - 1000));
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "taesd:" + dir + "/cut.pth"}), "cut.pth");
}

// A TAESD file with a tensor missing or of another shape: the file and the key, in one line.
TEST(VaeDecoder, WrongTensorsAreNamed) {
    const std::string dir = sdtest::temp_dir();
    const std::string script =
        "import sys\n"
        "sys.path.insert(0, sys.argv[1] + '/python')\n"
        "from sd_export.safetensors_io import read_tensors, write_safetensors\n"
        "t, out = read_tensors(sys.argv[2]), sys.argv[3]\n"
        "write_safetensors(out + '/missing.safetensors', [(k, v) for k, v in t.items() if k != 'decoder.layers.3.conv.2.bias'])\n"
        "write_safetensors(out + '/shape.safetensors', [(k, v[:8] if k == 'decoder.layers.6.weight' else v) for k, v in t.items()])\n";
    sdtest::write_text(dir + "/make.py", script);
    const auto made = run({sdtest::env("SD_PYTHON"), dir + "/make.py", sdtest::env("SD_SOURCE_DIR"),
                           sdtest::fixtures() + "/taesd/taesd_tiny/diffusion_pytorch_model.safetensors", dir});
    ASSERT_EQ(made.exit_code, 0) << made.err;
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "taesd:" + dir + "/missing.safetensors"}),
                          "missing.safetensors lacks the tensor 4.conv.2.bias");
    expect_one_line_error(run_tiny(dir, {"--vae-decoder", "taesd:" + dir + "/shape.safetensors"}),
                          "shape.safetensors: 7.weight is [8,16,3,3], expected [16,16,3,3]");
}

// --vae: standalone VAE files written with the export package's safetensors
// writer from the tiny model's own VAE (both key styles), changed weights, a
// wrong shape, NaN weights, a truncated file; and the same file given to the export.
class VaeOverride : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new std::string(sdtest::temp_dir());
        const std::string script =
            "import sys, torch\n"
            "sys.path.insert(0, sys.argv[1] + '/python')\n"
            "from sd_export.safetensors_io import read_tensors, write_safetensors\n"
            "vae, out = read_tensors(sys.argv[2]), sys.argv[3]\n"
            "enc = [('encoder.conv_in.weight', torch.ones(8, 3, 3, 3)), ('quant_conv.weight', torch.ones(8, 8, 1, 1))]\n"
            "write_safetensors(out + '/bare.safetensors', list(vae.items()) + enc)\n"
            "write_safetensors(out + '/prefixed.safetensors', [('first_stage_model.' + k, v) for k, v in vae.items()])\n"
            "scaled = {k: (v * 0.5 if k == 'decoder.conv_out.weight' else v) for k, v in vae.items()}\n"
            "write_safetensors(out + '/scaled.safetensors', list(scaled.items()))\n"
            "bad = {k: (v[:, :2] if k == 'decoder.conv_in.weight' else v) for k, v in vae.items()}\n"
            "write_safetensors(out + '/wrong_shape.safetensors', list(bad.items()))\n"
            "nan = {k: (v * float('nan') if k == 'decoder.conv_out.weight' else v) for k, v in vae.items()}\n"
            "write_safetensors(out + '/nan.safetensors', list(nan.items()))\n"
            "data = open(out + '/bare.safetensors', 'rb').read()\n"
            "open(out + '/truncated.safetensors', 'wb').write(data[:len(data) // 2])\n";
        sdtest::write_text(*dir_ + "/make.py", script);
        const auto r = run({sdtest::env("SD_PYTHON"), *dir_ + "/make.py", sdtest::env("SD_SOURCE_DIR"),
                            tiny_model() + "/vae_decoder.weights", *dir_});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        base_ = new std::vector<uint8_t>();
        const auto b = run_tiny(*dir_ + "/base", {});
        ASSERT_EQ(b.exit_code, 0) << b.err;
        *base_ = pixels_of(*dir_ + "/base/00000.png");
    }
    static std::vector<uint8_t> image_with(const std::vector<std::string>& extra) {
        const std::string out = sdtest::temp_dir();
        const auto r = run_tiny(out, extra);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.exit_code == 0 ? pixels_of(out + "/00000.png") : std::vector<uint8_t>{};
    }
    static std::string* dir_;
    static std::vector<uint8_t>* base_;
};
std::string* VaeOverride::dir_ = nullptr;
std::vector<uint8_t>* VaeOverride::base_ = nullptr;

TEST_F(VaeOverride, TheModelsOwnVaeGivesTheSameImage) {
    EXPECT_EQ(image_with({"--vae", *dir_ + "/bare.safetensors"}), *base_);
    EXPECT_EQ(image_with({"--vae", *dir_ + "/prefixed.safetensors"}), *base_);
    // Whole SD checkpoints hold their VAE under first_stage_model. (a .ckpt under state_dict. too).
    EXPECT_EQ(image_with({"--vae", sdtest::fixtures() + "/tiny/tiny.safetensors"}), *base_);
    EXPECT_EQ(image_with({"--vae", sdtest::test_models() + "/tiny.ckpt"}), *base_);
}

TEST_F(VaeOverride, OtherWeightsChangeTheImage) {
    const auto img = image_with({"--vae", *dir_ + "/scaled.safetensors"});
    ASSERT_EQ(img.size(), base_->size());
    EXPECT_NE(img, *base_);
    // Sequential loading loads the VAE again for every batch: with the same weights each time.
    const std::string a = sdtest::temp_dir(), b = sdtest::temp_dir();
    const std::vector<std::string> two = {"--vae", *dir_ + "/scaled.safetensors", "--n_iter", "2"};
    auto extra = two;
    extra.insert(extra.end(), {"--sequential-load", "on"});
    ASSERT_EQ(run_tiny(a, two).exit_code, 0);
    ASSERT_EQ(run_tiny(b, extra).exit_code, 0);
    EXPECT_EQ(pixels_of(a + "/00001.png"), pixels_of(b + "/00001.png"));
    EXPECT_EQ(pixels_of(b + "/00000.png"), img);
}

TEST_F(VaeOverride, BadFilesAreOneLine) {
    const std::string out = *dir_ + "/bad";
    expect_one_line_error(run_tiny(out, {"--vae", *dir_ + "/wrong_shape.safetensors"}), "decoder.conv_in.weight is [64,2,3,3]");
    expect_one_line_error(run_tiny(out, {"--vae", *dir_ + "/truncated.safetensors"}), "truncated.safetensors");
    // A NaN weight: refused before sampling (it made a NaN picture, "the VAE decoder gave NaN").
    expect_one_line_error(run_tiny(out, {"--vae", *dir_ + "/nan.safetensors"}),
                          "nan.safetensors: its tensor decoder.conv_out.weight holds NaN or infinite values");
    expect_one_line_error(run_tiny(out, {"--vae", *dir_ + "/none.safetensors"}), "none.safetensors");
    sdtest::write_text(*dir_ + "/unet.safetensors", sdtest::read_text(tiny_model() + "/unet.weights"));
    expect_one_line_error(run_tiny(out, {"--vae", *dir_ + "/unet.safetensors"}), "holds no VAE decoder tensors");
    expect_one_line_error(run_tiny(out, {"--vae", *dir_ + "/bare.safetensors", "--vae-decoder", taesd_tiny()}), "--vae");
}

// export_model.py --vae bakes the VAE into the model folder: the same image as --vae at run time.
TEST_F(VaeOverride, ExportWithVaeMatchesRunTimeVae) {
    const std::string model = *dir_ + "/exported";
    const std::string src = sdtest::env("SD_SOURCE_DIR"), fx = sdtest::fixtures() + "/tiny";
    auto e = run({sdtest::env("SD_PYTHON"), src + "/scripts/export_model.py", fx + "/tiny.safetensors", "--out", model,
                  "--config", fx + "/v1-tiny.yaml", "--text-config", fx + "/text_encoder.json", "--vae",
                  *dir_ + "/scaled.safetensors"});
    ASSERT_EQ(e.exit_code, 0) << e.err;
    const std::string out = sdtest::temp_dir();
    auto r = run({sdtest::cli(), "--model", model, "--outdir", out, "--quiet", "--prompt", "a red fox", "--seed", "3",
                  "--steps", "5", "--sampler", "ddim", "--threads", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(pixels_of(out + "/00000.png"), image_with({"--vae", *dir_ + "/scaled.safetensors"}));
    auto bad = run({sdtest::env("SD_PYTHON"), src + "/scripts/export_model.py", fx + "/tiny.safetensors", "--out",
                    *dir_ + "/exported_bad", "--config", fx + "/v1-tiny.yaml", "--text-config", fx + "/text_encoder.json",
                    "--vae", *dir_ + "/wrong_shape.safetensors"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_EQ(sdtest::lines(bad.err).size(), 1u) << bad.err;
    EXPECT_NE(bad.err.find("decoder.conv_in.weight is [64, 2, 3, 3]"), std::string::npos) << bad.err;
    auto missing = run({sdtest::env("SD_PYTHON"), src + "/scripts/export_model.py", fx + "/tiny.safetensors", "--out",
                        *dir_ + "/exported_missing", "--config", fx + "/v1-tiny.yaml", "--text-config",
                        fx + "/text_encoder.json", "--vae", *dir_ + "/none.safetensors"});
    EXPECT_EQ(missing.exit_code, 1);
    EXPECT_EQ(sdtest::lines(missing.err).size(), 1u) << missing.err;
    EXPECT_NE(missing.err.find("--vae " + *dir_ + "/none.safetensors does not exist"), std::string::npos) << missing.err;
}
