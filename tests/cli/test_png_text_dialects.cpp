// Other programs' PNG texts through the CLI (issue 35 part 3): every
// stable-diffusion.cpp PNG of shared/conformance/png-text/ and web UI texts are
// read with --dry-run, which prints the job the tool would run, or refused in one
// line naming the fields the tool cannot honour (--from-png-lenient skips them).
// Samplers and schedules the catalog may not have yet are asked of the catalog.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "io/image_io.h"
#include "run/batch_plan.h"
#include "sd/error.h"
#include "sd/sampler_catalog.h"
#include "sd/version.h"
#include "test_util.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> dry_run(const std::string& outdir, std::vector<std::string> more) {
    std::vector<std::string> argv = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", outdir,
                                     "--dry-run"};
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
}

// The tiny model's "Model hash": A1111's short hash of the checkpoint it was exported from.
std::string tiny_model_hash() {
    const json config = json::parse(sdtest::read_text(sdtest::test_models() + "/tiny-st/model.json"));
    return config.at("source_sha256").get<std::string>().substr(0, 10);
}

// The catalog's sampler of a web UI name when it takes this schedule, else "".
std::string catalog_sampler(const std::string& a1111, const std::string& schedule) {
    for (const auto& s : sd::samplers()) {
        if (s.a1111_name != a1111) continue;
        try {
            sd::check_sampler_settings(s.name, schedule);
            return s.name;
        } catch (const sd::Error&) {
            return "";
        }
    }
    return "";
}

std::string png_text_dir() { return sdtest::env("SD_SHARED_CONFORMANCE") + "/png-text"; }

void write_png(const std::string& path, const std::string& text) {
    sd::Image img;
    img.width = img.height = 8;
    img.rgb.assign(8 * 8 * 3, 0);
    ASSERT_TRUE(sd::save_png_new(path, img, text));
}

// What a png-text PNG must give: the settings, with the web UI sampler and schedule the catalog is asked for.
struct SdcppExpect {
    std::string sampler_a1111, schedule, sampler_field;  // sampler_field: its "Sampler" as written
    std::string prompt, negative;
    uint64_t seed;
    int steps, width, height, clip_skip;
    double scale;
    std::string rng;                  // "" : refused for its RNG (std_default)
};

}  // namespace

// Acceptance: every png-text PNG is read with every field mapped (the job --dry-run
// prints), or refused in one line naming each field the tool cannot honour.
TEST(PngTextDialects, EverySdcppPngIsReadOrRefusedByName) {
    const std::map<std::string, SdcppExpect> expect = {
        {"sdcpp-euler_a-karras-cuda.png",
         {"Euler a", "karras", "euler_a karras", "a cat on a sofa, (best quality:1.2)", "blurry", 42, 3, 64, 64, 1, 7, "nv"}},
        {"sdcpp-dpmpp2m-exponential-std_default-clipskip2.png",
         {"DPM++ 2M", "exponential", "dpm++2m exponential", "a lighthouse at dusk", "", 1234, 4, 64, 96, 2, 5, ""}},
        {"sdcpp-heun-discrete-cuda.png",
         {"Heun", "default", "heun discrete", "an astronaut riding a horse", "", 7, 3, 96, 64, 1, 7, "nv"}},
        {"sdcpp-dpmpp2s_a-sgm_uniform-batch-image0.png",
         {"DPM++ 2S a", "sgm_uniform", "dpm++2s_a sgm_uniform", "a bowl of ramen", "", 99, 3, 64, 64, 1, 7, "nv"}},
        {"sdcpp-dpmpp2s_a-sgm_uniform-batch-image1.png",
         {"DPM++ 2S a", "sgm_uniform", "dpm++2s_a sgm_uniform", "a bowl of ramen", "", 100, 3, 64, 64, 1, 7, "nv"}},
    };
    int seen = 0;
    for (const auto& entry : fs::directory_iterator(png_text_dir())) {
        if (entry.path().extension() != ".png") continue;
        const std::string file = entry.path().filename().string();
        SCOPED_TRACE(file);
        ASSERT_EQ(expect.count(file), 1u) << "a png-text PNG without an expectation";
        const SdcppExpect& e = expect.at(file);
        ++seen;
        const std::string dir = sdtest::temp_dir();
        const std::string sampler = catalog_sampler(e.sampler_a1111, e.schedule);
        std::vector<std::string> cannot;
        if (e.rng.empty()) cannot.push_back("RNG: std_default");
        if (sampler.empty()) cannot.push_back("Sampler: " + e.sampler_field);
        auto r = sdtest::run(dry_run(dir + "/out", {"--from-png", entry.path().string()}));
        if (!cannot.empty()) {
            EXPECT_EQ(r.exit_code, 1) << r.err;
            EXPECT_EQ(r.out, "");
            ASSERT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
            EXPECT_NE(r.err.find(file + ": this tool cannot honour "), std::string::npos) << r.err;
            for (const auto& f : cannot) EXPECT_NE(r.err.find(f), std::string::npos) << r.err;
            // --from-png-lenient: remade without them, named on stderr in one line
            r = sdtest::run(dry_run(dir + "/out", {"--from-png-lenient", "--from-png", entry.path().string()}));
            ASSERT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
            EXPECT_NE(r.err.find("warning: " + entry.path().string() + ": remaking it without what this tool cannot honour: "),
                      std::string::npos) << r.err;
            for (const auto& f : cannot) EXPECT_NE(r.err.find(f), std::string::npos) << r.err;
        }
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const auto lines = sdtest::lines(r.out);
        ASSERT_EQ(lines.size(), 1u) << r.out;
        const json j = json::parse(lines[0]);
        EXPECT_EQ(j["prompt"], e.prompt);
        EXPECT_EQ(j["negative_prompt"], e.negative);
        EXPECT_EQ(j["seed"], e.seed);  // image1 of the batch: its own seed, 100
        EXPECT_EQ(j["seed_mode"], "per-image");
        EXPECT_EQ(j["index"], 0);
        EXPECT_EQ(j["steps"], e.steps);
        EXPECT_EQ(j["width"], e.width);
        EXPECT_EQ(j["height"], e.height);
        EXPECT_EQ(j["clip_skip"], e.clip_skip);
        EXPECT_EQ(j["scale"], e.scale);
        EXPECT_EQ(j["prompt_syntax"], "a1111");
        EXPECT_EQ(j["noise"]["rng"], e.rng.empty() ? "cpu" : e.rng);  // skipped: the tool's own
        EXPECT_EQ(j["noise"]["eta"], nullptr);                            // "Eta: inf": the sampler's default
        EXPECT_EQ(j["noise"]["ensd"], 0);
        EXPECT_EQ(j["init"], nullptr);
        if (!sampler.empty()) {
            EXPECT_EQ(j["sampler"], sampler);
            EXPECT_EQ(j["schedule"], e.schedule);
        }
        // nothing written
        EXPECT_FALSE(fs::exists(dir + "/out"));
    }
    EXPECT_EQ(seen, static_cast<int>(expect.size()));
}

// A web UI text quoted in tests/data/webui-parameters (ENSD and Eta): its noise
// settings, per-image seeds, and the text the remake would carry.
TEST(PngTextDialects, WebUiNoiseFieldsReachTheJob) {
    const std::string dir = sdtest::temp_dir();
    write_png(dir + "/ekmix.png", "masterpiece,best quality\nSteps: 28, Sampler: Euler a, CFG scale: 11, Seed: 1333057453, "
                                  "Size: 512x768, Model hash: 625191b6, Eta: 0.5, ENSD: 31337");
    const auto r = sdtest::run(dry_run(dir + "/out", {"--from-png", dir + "/ekmix.png"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["sampler"], "euler_a");
    EXPECT_EQ(j["schedule"], "default");
    EXPECT_EQ(j["seed"], 1333057453u);
    EXPECT_EQ(j["seed_mode"], "per-image");
    EXPECT_EQ(j["noise"]["rng"], "nv");
    EXPECT_EQ(j["noise"]["ensd"], 31337);
    EXPECT_EQ(j["noise"]["eta"], 0.5);
    EXPECT_EQ(j["width"], 512);
    EXPECT_EQ(j["height"], 768);
    EXPECT_NE(j["parameters"].get<std::string>().find(
                  "Steps: 28, Sampler: Euler a, Schedule type: Uniform, CFG scale: 11, Seed: 1333057453, Size: 512x768, "
                  "Model hash: " + tiny_model_hash() + ", Model: tiny, ENSD: 31337, RNG: NV, Eta: 0.5, Seed mode: per-image, Image index: 0"),
              std::string::npos)
        << j["parameters"];
    // flags given override the PNG, the rest comes from it
    const auto o = sdtest::run(dry_run(dir + "/out", {"--from-png", dir + "/ekmix.png", "--steps", "3", "--seed-mode", "compvis"}));
    ASSERT_EQ(o.exit_code, 0) << o.err;
    const json k = json::parse(o.out);
    EXPECT_EQ(k["steps"], 3);
    EXPECT_EQ(k["seed_mode"], "compvis");
    EXPECT_EQ(k["noise"]["ensd"], 31337);
}

// A web UI hires-fix text: refused naming the fields; lenient, remade as plain txt2img.
TEST(PngTextDialects, HiresFixIsRefusedOrSkipped) {
    const std::string dir = sdtest::temp_dir();
    write_png(dir + "/lomo.png", "lomo style portrait\nNegative prompt: blur haze\nSteps: 20, Sampler: Euler a, CFG scale: 7, "
                                 "Seed: 1361398596, Size: 448x640, Model hash: 12437ef9d1, Denoising strength: 0.3, "
                                 "Hires resize: 640x960, Hires upscaler: None");
    auto r = sdtest::run(dry_run(dir + "/out", {"--from-png", dir + "/lomo.png"}));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "sd-txt2img: error: " + dir + "/lomo.png: this tool cannot honour Denoising strength: 0.3, "
                     "Hires resize: 640x960, Hires upscaler: None; --from-png-lenient remakes it without them\n");
    r = sdtest::run(dry_run(dir + "/out", {"--from-png-lenient", "--from-png", dir + "/lomo.png"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "sd-txt2img: warning: " + dir + "/lomo.png: remaking it without what this tool cannot honour: "
                     "Denoising strength: 0.3, Hires resize: 640x960, Hires upscaler: None\n");
    const json j = json::parse(r.out);
    EXPECT_EQ(j["init"], nullptr);
    EXPECT_EQ(j["width"], 448);
    EXPECT_EQ(j["negative_prompt"], "blur haze");
}

// This tool's own text with noise fields: the job's text is the PNG's, to the byte.
TEST(PngTextDialects, OwnTextWithNoiseFieldsIsTheJobsText) {
    const std::string dir = sdtest::temp_dir();
    sd::PromptItem item;
    item.prompt = "a red fox";
    item.negative_prompt = "blurry";
    item.settings.sampler = "euler_a";
    item.settings.schedule = "karras";
    item.settings.steps = 3;
    item.settings.scale = 6.5;
    item.settings.width = 64;
    item.settings.height = 96;
    auto& n = item.settings.noise;
    n.rng = "nv";
    n.ensd = 31337;
    n.subseed = 900;
    n.subseed_strength = 0.4;
    n.seed_resize_from_w = 128;
    n.seed_resize_from_h = 64;
    n.eta = 0.8;
    sd::PlannedImage img;
    img.seed = 1007;
    img.index = 7;
    const std::string text = sd::parameters_text(item, img, sd::SeedMode::per_image, "tiny", {}, tiny_model_hash());
    write_png(dir + "/own.png", text);
    const auto r = sdtest::run(dry_run(dir + "/out", {"--from-png", dir + "/own.png"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["parameters"], text);
    EXPECT_EQ(j["index"], 7);
    EXPECT_EQ(j["seed"], 1007);
    EXPECT_EQ(j["noise"]["subseed"], 900);
    EXPECT_EQ(j["noise"]["subseed_strength"], 0.4);
    EXPECT_EQ(j["noise"]["seed_resize_from"], "128x64");
    EXPECT_EQ(j["noise"]["rng"], "nv");
    EXPECT_EQ(j["noise"]["eta"], 0.8);
}

// --dry-run without --from-png: the images of the run, nothing written, no weights loaded.
TEST(PngTextDialects, DryRunPrintsTheRunsImages) {
    const std::string dir = sdtest::temp_dir();
    const auto r = sdtest::run(dry_run(dir + "/out", {"--prompt", "a red fox", "--n_samples", "2", "--n_iter", "2",
                                                      "--seed", "5", "--sampler", "euler", "--schedule", "karras"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto lines = sdtest::lines(r.out);
    ASSERT_EQ(lines.size(), 4u) << r.out;
    for (int i = 0; i < 4; ++i) {
        const json j = json::parse(lines[i]);
        EXPECT_EQ(j["index"], i);
        EXPECT_EQ(j["seed"], 5);
        EXPECT_EQ(j["batch"]["position"], i % 2);
        EXPECT_EQ(j["batch"]["number"], i / 2);
        EXPECT_EQ(j["sampler"], "euler");
        EXPECT_EQ(j["schedule"], "karras");
        EXPECT_EQ(j["noise"]["rng"], "cpu");
        EXPECT_NE(j["parameters"].get<std::string>().find("Sampler: Euler, Schedule type: Karras, CFG scale: 7.5, Seed: 5, "
                                                          "Size: 64x64, Model hash: " + tiny_model_hash() +
                                                          ", Model: tiny, RNG: CPU, Seed mode: compvis"),
                  std::string::npos)
            << j["parameters"];
    }
    EXPECT_FALSE(fs::exists(dir + "/out"));
    // an option that does not fit is refused as it would be for a run
    const auto bad = sdtest::run(dry_run(dir + "/out", {"--prompt", "a", "--sampler", "plms", "--schedule", "karras"}));
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_EQ(sdtest::lines(bad.err).size(), 1u) << bad.err;
}
