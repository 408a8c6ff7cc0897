// Every image remade from its PNG (issue 18, part 1): the "parameters" text
// holds everything that decides the image, and --from-png reads it back. The
// remade PNG must be the original byte for byte: same pixels, same text.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/image_io.h"
#include "io/png_text.h"
#include "sd/sampler_catalog.h"
#include "sd/version.h"
#include "test_util.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> fast_args(const std::string& outdir) {
    return {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", outdir, "--threads", "1",
            "--H", "64", "--W", "64", "--steps", "2", "--quiet", "--json"};
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// The paths a --json run printed, in order.
std::vector<std::string> paths_of(const sdtest::CmdResult& r) {
    std::vector<std::string> paths;
    for (const auto& l : sdtest::lines(r.out))
        if (!l.empty()) paths.push_back(json::parse(l)["path"]);
    return paths;
}

std::string parameters_of(const std::string& png) {
    const std::string bytes = sdtest::read_text(png);
    return sd::png_read_text(std::vector<uint8_t>(bytes.begin(), bytes.end()))["parameters"];
}

}  // namespace

// Acceptance: every sampler in both seed modes, --scale, --negative-prompt,
// --schedule karras, a compvis batch of 3 (different prompts, plain syntax) and
// a random seed (--seed -1): --from-png on each image gives the same PNG.
TEST(FromPng, EverySamplerAndSeedModeRemakesTheSamePng) {
    const std::string dir = sdtest::temp_dir();
    std::vector<std::string> originals;
    auto keep = [&](const sdtest::CmdResult& r) {
        ASSERT_EQ(r.exit_code, 0) << r.err;
        for (const auto& p : paths_of(r)) originals.push_back(p);
    };
    // per-image seeds: one run, a line per sampler and per setting
    std::string jsonl;
    for (const auto& s : sd::samplers()) jsonl += json{{"prompt", "a red fox"}, {"sampler", s.name}}.dump() + "\n";
    jsonl += R"({"prompt": "a red fox", "sampler": "euler_a", "schedule": "karras"})" "\n";
    jsonl += R"({"prompt": "a red fox", "scale": 3.5, "negative_prompt": "blurry, dark"})" "\n";
    // 3 steps: refused by the CompVis spacing, taken by trailing
    jsonl += R"({"prompt": "a red fox", "sampler": "ddim", "schedule": "trailing", "steps": 3})" "\n";
    // the Turbo recipe: diffusers' trailing Euler ancestral, the cond alone
    jsonl += R"({"prompt": "a red fox", "sampler": "euler_a", "schedule": "trailing", "steps": 2, "scale": 1})" "\n";
    sdtest::write_text(dir + "/p.jsonl", jsonl);
    keep(sdtest::run(plus(fast_args(dir + "/per"), {"--from-file", dir + "/p.jsonl", "--seed-mode", "per-image", "--seed", "7"})));
    ASSERT_EQ(originals.size(), sd::samplers().size() + 4);
    // compvis seeds: one run per sampler (each image the first of its run), the first with a random seed
    for (size_t i = 0; i < sd::samplers().size(); ++i) {
        const std::string& s = sd::samplers()[i].name;
        keep(sdtest::run(plus(fast_args(dir + "/cv-" + s), {"--prompt", "a blue bird", "--sampler", s, "--seed", i == 0 ? "-1" : "9"})));
    }
    // a compvis batch of 3 different prompts; euler_a draws noise for the whole batch at every step
    sdtest::write_text(dir + "/three.txt", "a red fox\na (blue:1.4) bird\na green frog\n");
    keep(sdtest::run(plus(fast_args(dir + "/batch"), {"--from-file", dir + "/three.txt", "--n_samples", "3", "--sampler",
                                                      "euler_a", "--prompt-syntax", "plain", "--seed", "11"})));
    ASSERT_EQ(originals.size(), 2 * sd::samplers().size() + 7);
    EXPECT_NE(parameters_of(originals[sd::samplers().size() + 3]).find("Sampler: Euler a, Schedule type: Trailing, CFG scale: 1,"),
              std::string::npos);
    EXPECT_NE(parameters_of(originals[sd::samplers().size() + 2]).find("Sampler: DDIM, Schedule type: Trailing"), std::string::npos);
    EXPECT_NE(parameters_of(originals.back()).find("Batch size: 3, Batch position: 2, Batch number: 0"), std::string::npos);
    EXPECT_NE(parameters_of(originals.back()).find("Version: " + std::string(sd::kVersionName)), std::string::npos);

    // All of them remade in one run, each from its PNG alone.
    auto remade = sdtest::run(plus({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", dir + "/remade",
                                    "--threads", "1", "--quiet", "--json", "--from-png"}, originals));
    ASSERT_EQ(remade.exit_code, 0) << remade.err;
    const auto again = paths_of(remade);
    ASSERT_EQ(again.size(), originals.size()) << remade.out;
    for (size_t i = 0; i < originals.size(); ++i)
        EXPECT_EQ(sdtest::read_text(again[i]), sdtest::read_text(originals[i]))
            << "not the same PNG: " << originals[i] << "\n" << parameters_of(originals[i]) << "\nremade as\n" << parameters_of(again[i]);

    // Flags given with --from-png override what the PNG says; the rest comes from it.
    auto changed = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", dir + "/changed",
                                "--threads", "1", "--quiet", "--json", "--steps", "4", "--sampler", "ddim", "--from-png",
                                originals[sd::samplers().size() + 1]});
    ASSERT_EQ(changed.exit_code, 0) << changed.err;
    json c = json::parse(changed.out);
    EXPECT_EQ(c["steps"], 4);
    EXPECT_EQ(c["sampler"], "ddim");
    EXPECT_EQ(c["scale"], 3.5);
    EXPECT_EQ(c["negative_prompt"], "blurry, dark");
    EXPECT_EQ(c["seed"], 7 + sd::samplers().size() + 1);
}

// Acceptance (issue 35): the web UI's noise and an SDE sampler by its web UI
// names (--rng nv --ensd 31337 --sampler "DPM++ 2M SDE" --schedule Karras, its
// Brownian tree seeded per image), then with a variation seed and seed resize:
// --from-png on each image gives the same PNG, and the text names them all.
TEST(FromPng, WebUiNoiseAndSdeSamplerRemakeTheSamePng) {
    const std::string dir = sdtest::temp_dir();
    const std::vector<std::string> web = {"--rng", "nv", "--ensd", "31337", "--sampler", "DPM++ 2M SDE", "--schedule", "Karras",
                                          "--seed-mode", "per-image", "--seed", "1234", "--n_samples", "2",
                                          "--prompt", "a red fox"};
    auto r = sdtest::run(plus(fast_args(dir + "/a"), web));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto originals = paths_of(r);
    ASSERT_EQ(originals.size(), 2u);
    auto v = sdtest::run(plus(plus(fast_args(dir + "/b"), web),
                              {"--subseed", "99", "--subseed-strength", "0.3", "--seed-resize-from", "128x64"}));
    ASSERT_EQ(v.exit_code, 0) << v.err;
    for (const auto& p : paths_of(v)) originals.push_back(p);
    ASSERT_EQ(originals.size(), 4u);
    const std::string text = parameters_of(originals[2]);
    for (const char* field : {"Sampler: DPM++ 2M SDE, Schedule type: Karras", "Seed: 1234", "ENSD: 31337", "RNG: NV",
                              "Variation seed: 99", "Variation seed strength: 0.3", "Seed resize from: 128x64"})
        EXPECT_NE(text.find(field), std::string::npos) << field << " not in " << text;
    // The noise options change the picture (else this test could not fail).
    EXPECT_NE(sdtest::read_text(originals[0]), sdtest::read_text(originals[2]));
    auto remade = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", dir + "/remade",
                               "--threads", "1", "--quiet", "--json", "--from-png", originals[0], originals[1],
                               originals[2], originals[3]});
    ASSERT_EQ(remade.exit_code, 0) << remade.err;
    const auto again = paths_of(remade);
    ASSERT_EQ(again.size(), originals.size());
    for (size_t i = 0; i < originals.size(); ++i)
        EXPECT_EQ(sdtest::read_text(again[i]), sdtest::read_text(originals[i]))
            << "not the same PNG: " << parameters_of(originals[i]) << "\nremade as\n" << parameters_of(again[i]);
}

// A compvis image after the first batch depends on every batch before it: refused, saying why.
TEST(FromPng, LaterCompvisBatchIsRefused) {
    const std::string dir = sdtest::temp_dir();
    sd::Image img;
    img.width = img.height = 8;
    img.rgb.assign(8 * 8 * 3, 0);
    ASSERT_TRUE(sd::save_png_new(dir + "/x.png", img,
                                 "a cat\nSteps: 2, Sampler: PLMS, CFG scale: 7.5, Seed: 1, Size: 64x64, Model: tiny, "
                                 "Seed mode: compvis, Image index: 3, Batch size: 1, Batch position: 0, Batch number: 3"));
    ASSERT_TRUE(sd::save_png_new(dir + "/bare.png", img));
    const std::vector<std::string> base = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", dir + "/o", "--from-png"};
    for (const auto& [file, says] : std::vector<std::pair<std::string, std::string>>{
             {"x.png", "x.png: this image is from batch 3 of a compvis run"},
             {"bare.png", "bare.png carries no \"parameters\" text"},
             {"none.png", "none.png does not exist"}}) {
        auto r = sdtest::run(plus(base, {dir + "/" + file}));
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
        EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
        EXPECT_EQ(r.out, "");
    }
    EXPECT_FALSE(fs::exists(dir + "/o/00000.png"));
}

TEST(Version, PrintsTheVersionAndTheLibTorchBuild) {
    auto r = sdtest::run({sdtest::cli(), "--version"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind(std::string(sd::kVersionName) + " (LibTorch 1.", 0), 0u) << r.out;
}
