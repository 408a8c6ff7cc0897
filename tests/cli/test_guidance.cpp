// --scale 1 is the cond alone for every sampler: one UNet row per image per
// model evaluation and no negative prompt through the text encoder; any other
// scale runs two rows (classifier-free guidance). Read from --verbose's counts.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sd/sampler_catalog.h"
#include "test_util.h"

namespace {

struct Counts {
    long long evaluations = -1, unet_rows = -1, text_rows = -1;
};

// "sd-txt2img: unet: E model evaluations, R UNet rows, T text encoder rows (last batch)"
Counts run_counts(const std::string& sampler, const std::string& scale, int images) {
    auto r = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", sdtest::temp_dir(),
                          "--quiet", "--verbose", "--prompt", "a red fox", "--negative-prompt", "blurry", "--H", "64",
                          "--W", "64", "--steps", "2", "--sampler", sampler, "--scale", scale, "--n_samples",
                          std::to_string(images), "--threads", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    Counts c;
    for (const auto& line : sdtest::lines(r.err))
        if (std::sscanf(line.c_str(), "sd-txt2img: unet: %lld model evaluations, %lld UNet rows, %lld text encoder rows",
                        &c.evaluations, &c.unet_rows, &c.text_rows) == 3)
            return c;
    ADD_FAILURE() << "no unet line in --verbose output:\n" << r.err;
    return c;
}

}  // namespace

TEST(Guidance, ScaleOneRunsOneUnetRowPerImageForEverySampler) {
    const int images = 2;
    for (const auto& s : sd::samplers()) {
        const Counts one = run_counts(s.name, "1", images), cfg = run_counts(s.name, "7.5", images);
        EXPECT_GT(one.evaluations, 0) << s.name;
        EXPECT_EQ(one.unet_rows, one.evaluations * images) << s.name << " at --scale 1";
        EXPECT_EQ(one.text_rows, images) << s.name << " at --scale 1: the negative prompt is not encoded";
        EXPECT_EQ(cfg.evaluations, one.evaluations) << s.name;
        EXPECT_EQ(cfg.unet_rows, 2 * cfg.evaluations * images) << s.name << " at --scale 7.5";
        EXPECT_EQ(cfg.text_rows, 2 * images) << s.name << " at --scale 7.5";
    }
}

// ---- the model's recorded sampler recipe (model.json default_*, docs/model-format.md) ----

namespace {

// The tiny model exported with an LCM recipe: lcm, 4 steps, scale 1.
std::string lcm_recipe_export() {
    const std::string out = sdtest::temp_dir() + "/tiny-lcm";
    const std::string fx = sdtest::fixtures() + "/tiny";
    auto r = sdtest::run({sdtest::env("SD_PYTHON"), sdtest::env("SD_SOURCE_DIR") + "/scripts/export_model.py",
                          fx + "/tiny.safetensors", "--out", out, "--config", fx + "/v1-tiny.yaml", "--text-config",
                          fx + "/text_encoder.json", "--default-sampler", "lcm", "--default-steps", "4", "--default-scale", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
}

nlohmann::json first_record(const std::string& model, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {sdtest::cli(), "--model", model, "--outdir", sdtest::temp_dir(), "--quiet", "--json",
                                     "--prompt", "a red fox", "--H", "64", "--W", "64", "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = sdtest::run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto out = sdtest::lines(r.out);
    return out.empty() ? nlohmann::json::object() : nlohmann::json::parse(out.at(0));
}

}  // namespace

TEST(ModelRecipe, ExportedDefaultsRunLcmWithoutFlagsAndFlagsWin) {
    const std::string m = lcm_recipe_export();
    auto info = nlohmann::json::parse(sdtest::read_text(m + "/model.json"));
    EXPECT_EQ(info["default_sampler"], "lcm");
    EXPECT_EQ(info["default_steps"], 4);
    EXPECT_EQ(info["guidance_scale"], 1.0);

    const auto plain = first_record(m, {});
    EXPECT_EQ(plain["sampler"], "lcm");
    EXPECT_EQ(plain["steps"], 4);
    EXPECT_EQ(plain["scale"], 1.0);
    EXPECT_NE(plain["parameters"].get<std::string>().find("Steps: 4, Sampler: LCM, CFG scale: 1,"), std::string::npos)
        << plain["parameters"];

    const auto steps = first_record(m, {"--steps", "2"});  // the recipe's sampler, the user's steps
    EXPECT_EQ(steps["sampler"], "lcm");
    EXPECT_EQ(steps["steps"], 2);
    const auto other = first_record(m, {"--sampler", "euler", "--steps", "3", "--scale", "5"});
    EXPECT_EQ(other["sampler"], "euler");
    EXPECT_EQ(other["steps"], 3);
    EXPECT_EQ(other["scale"], 5.0);
    const auto plms = first_record(m, {"--plms", "--steps", "2"});  // CompVis's flag is a sampler choice too
    EXPECT_EQ(plms["sampler"], "plms");

    // Bad recipes in model.json: one line naming the file and the key or value.
    const std::vector<std::pair<std::pair<const char*, nlohmann::json>, std::string>> bad = {
        {{"default_sampler", "dpm_fast"}, "dpm_fast"},  // a web UI sampler this tool does not have
        {{"default_sampler", 7}, "default_sampler"},
        {{"default_steps", 0}, "default_steps"},
        {{"default_steps", 60}, "--steps 60"},
        {{"default_schedule", "karras"}, "karras"},
    };
    for (const auto& [kv, mention] : bad) {
        auto broken = info;
        broken[kv.first] = kv.second;
        sdtest::write_text(m + "/model.json", broken.dump());
        auto r = sdtest::run({sdtest::cli(), "--model", m, "--outdir", sdtest::temp_dir(), "--prompt", "a"});
        EXPECT_EQ(r.exit_code, 1) << kv.first;
        EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
        EXPECT_NE(r.err.find("model.json"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(mention), std::string::npos) << r.err;
    }
    auto orphan = info;
    orphan.erase("default_sampler");
    sdtest::write_text(m + "/model.json", orphan.dump());
    auto r = sdtest::run({sdtest::cli(), "--model", m, "--outdir", sdtest::temp_dir(), "--prompt", "a"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("default_sampler"), std::string::npos) << r.err;
}
