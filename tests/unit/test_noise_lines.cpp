// A JSONL prompt line's own noise options (issue 35 part 2): read with the
// flags' rules, refused with the line named, and only in per-image seed mode.
#include <gtest/gtest.h>

#include "run/batch_plan.h"
#include "sd/prompts.h"
#include "test_util.h"

namespace {

sd::Txt2ImgJob jsonl_job(const std::string& text, sd::SeedMode mode) {
    sd::Txt2ImgJob job;
    job.prompts = sd::parse_prompts(text, "p.jsonl", true);
    job.from_file = true;
    job.seed_mode = mode;
    return job;
}

}  // namespace

TEST(NoiseLines, ALineSetsItsOwnNoise) {
    const auto plan = sd::plan_run(jsonl_job(
        "{\"prompt\":\"a\"}\n"
        "{\"prompt\":\"b\",\"rng\":\"NV\",\"ensd\":31337,\"subseed\":7,\"subseed_strength\":0.25,"
        "\"seed_resize_from\":\"128x96\"}\n",
        sd::SeedMode::per_image));
    ASSERT_EQ(plan.items.size(), 2u);
    EXPECT_EQ(plan.items[0].settings.noise, sd::NoiseSettings{});
    const sd::NoiseSettings& n = plan.items[1].settings.noise;
    EXPECT_EQ(n.rng, "nv");
    EXPECT_EQ(n.ensd, 31337);
    EXPECT_EQ(n.subseed, 7u);
    EXPECT_EQ(n.subseed_strength, 0.25);
    EXPECT_EQ(n.seed_resize_from_w, 128);
    EXPECT_EQ(n.seed_resize_from_h, 96);
}

TEST(NoiseLines, RefusedWithTheLineNamed) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"{\"prompt\":\"a\",\"rng\":\"gpu\"}", "p.jsonl:1: --rng must be cpu or nv"},
        {"{\"prompt\":\"a\",\"subseed_strength\":0.5}", "p.jsonl:1: --subseed-strength needs --subseed"},
        {"{\"prompt\":\"a\",\"subseed\":1,\"subseed_strength\":2}", "p.jsonl:1: --subseed-strength must be from 0"},
        {"{\"prompt\":\"a\",\"seed_resize_from\":\"64\"}", "p.jsonl:1: --seed-resize-from"},
        {"{\"prompt\":\"a\",\"ensd\":1.5}", "p.jsonl:1: \"ensd\" must be a whole number"},
        {"{\"prompt\":\"a\",\"subseed\":-1}", "p.jsonl:1: \"subseed\" must be a whole number"},
        {"{\"prompt\":\"a\",\"rng\":3}", "p.jsonl:1: \"rng\" must be a string"},
    };
    for (const auto& [line, message] : cases) {
        const std::string err =
            sdtest::error_of([&] { sd::plan_run(jsonl_job(line + "\n", sd::SeedMode::per_image)); });
        EXPECT_EQ(err.rfind(message, 0), 0u) << line << " -> " << err;
    }
    // compvis noise is one generator for the run: a line cannot change it.
    const std::string err =
        sdtest::error_of([] { sd::plan_run(jsonl_job("{\"prompt\":\"a\",\"ensd\":5}\n", sd::SeedMode::compvis)); });
    EXPECT_NE(err.find("need --seed-mode per-image"), std::string::npos) << err;
}
