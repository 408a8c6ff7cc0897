// The JSON lines of --json, --manifest and --tokenize: keys in their documented
// order, exact seeds, and bytes that are not UTF-8 replaced instead of throwing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/records.h"

namespace {

sd::PromptItem item() {
    sd::PromptItem it;
    it.prompt = "a \"red\" cube";
    it.negative_prompt = "blur";
    it.line = 3;
    it.settings.steps = 7;
    it.settings.sampler = "euler_a";
    it.settings.schedule = "karras";
    it.settings.scale = 3.5;
    it.settings.width = 96;
    it.settings.height = 64;
    return it;
}

}  // namespace

TEST(Records, ImageRecordHoldsTheImagesSettingsInOrder) {
    const auto it = item();
    sd::ImageRecord r;
    r.path = "out/00003.png";
    r.item = &it;
    r.index = 3;
    r.seed = 18446744073709551615ull;
    r.seed_mode = sd::SeedMode::per_image;
    r.model = "tiny";
    r.seconds = 1.23456;
    r.parameters = "text";
    const std::string line = sd::image_record_json(r);
    EXPECT_EQ(line.find('\n'), std::string::npos);
    const auto j = nlohmann::ordered_json::parse(line);
    std::vector<std::string> keys;
    for (const auto& kv : j.items()) keys.push_back(kv.key());
    EXPECT_EQ(keys, (std::vector<std::string>{"path", "prompt", "negative_prompt", "seed", "seed_mode", "index", "line",
                                              "steps", "sampler", "schedule", "scale", "width", "height", "size", "model",
                                              "seconds", "parameters"}));
    EXPECT_EQ(j["seed"].get<uint64_t>(), r.seed);
    EXPECT_EQ(j["prompt"], it.prompt);
    EXPECT_EQ(j["size"], "96x64");
    EXPECT_EQ(j["seconds"], 1.235);
    EXPECT_EQ(j["line"], 3);
    auto flag = it;
    flag.line = 0;  // --prompt: no line
    r.item = &flag;
    EXPECT_TRUE(nlohmann::json::parse(sd::image_record_json(r))["line"].is_null());
}

TEST(Records, GridManifestAndTokenLines) {
    const auto g = nlohmann::json::parse(sd::grid_record_json("out/grid-0000.png", "p", 4));
    EXPECT_EQ(g["grid"], true);
    EXPECT_EQ(g["images"], 4);
    const auto it = item();
    sd::ImageRecord r;
    r.path = std::string("out/caf\xe9.png");  // not UTF-8: replaced, not thrown
    r.item = &it;
    r.seed = 5;
    const auto m = nlohmann::json::parse(sd::manifest_record_json(r, "00ff", "1/3"));
    EXPECT_EQ(m["status"], "written");
    EXPECT_EQ(m["shard"], "1/3");
    EXPECT_EQ(m["model_hash"], "00ff");
    EXPECT_EQ(m["path"], "out/caf\xef\xbf\xbd.png");
    EXPECT_EQ(sd::token_ids_json({49406, 320, 49407}), "[49406,320,49407]");
}
