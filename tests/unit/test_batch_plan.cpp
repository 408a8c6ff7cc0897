// A run's plan (run/batch_plan.h): batches, seeds, names, metadata text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "test_util.h"
#include "run/batch_plan.h"


namespace {
sd::Txt2ImgJob file_job(const std::string& jsonl_or_text, bool jsonl, int n_samples, int n_iter) {
    sd::Txt2ImgJob job;
    job.prompts = sd::parse_prompts(jsonl_or_text, "p", jsonl);
    job.from_file = true;
    job.n_samples = n_samples;
    job.n_iter = n_iter;
    return job;
}
std::vector<size_t> batch_sizes(const sd::RunPlan& plan) {
    std::vector<size_t> v;
    for (const auto& b : plan.batches) v.push_back(b.images.size());
    return v;
}
}  // namespace

TEST(Plan, SevenPromptsInBatchesOfThreeThreeAndOneRepeatedThreeTimes) {
    auto plan = sd::plan_run(file_job("a\nb\nc\nd\ne\nf\ng\n", false, 3, 3));
    EXPECT_EQ(batch_sizes(plan), (std::vector<size_t>{3, 3, 1, 3, 3, 1, 3, 3, 1}));
    int expected_index = 0;
    for (const auto& b : plan.batches)
        for (const auto& img : b.images) {
            EXPECT_EQ(img.index, expected_index++);
            EXPECT_EQ(img.seed, 42u);  // compvis: the run's seed
        }
    EXPECT_EQ(plan.batches[3].images[0].iteration, 1);
    EXPECT_EQ(plan.batches[3].images[0].item, 0);
}

TEST(Plan, PromptsWithDifferentSettingsNeverShareABatch) {
    auto plan = sd::plan_run(file_job("{\"prompt\":\"a\"}\n{\"prompt\":\"b\",\"steps\":7}\n{\"prompt\":\"c\",\"steps\":7}\n"
                                      "{\"prompt\":\"d\"}\n{\"prompt\":\"e\",\"negative_prompt\":\"\"}\n",
                                      true, 3, 1));
    EXPECT_EQ(batch_sizes(plan), (std::vector<size_t>{1, 2, 2}));
}

TEST(Plan, LineWithItsOwnNIterDropsOutOfLaterIterations) {
    auto plan = sd::plan_run(file_job("{\"prompt\":\"a\",\"n_iter\":3}\n{\"prompt\":\"b\"}\n", true, 2, 1));
    ASSERT_EQ(plan.batches.size(), 4u);  // a, b, a, a
    EXPECT_EQ(plan.items[plan.batches[1].images[0].item].prompt, "b");
    EXPECT_EQ(plan.batches[3].images[0].iteration, 2);
}

TEST(Plan, PerImageSeedsAreSeedPlusIndexAndLineSeedsPlusIteration) {
    auto job = file_job("{\"prompt\":\"a\"}\n{\"prompt\":\"b\",\"seed\":1000}\n{\"prompt\":\"c\"}\n", true, 3, 2);
    job.seed_mode = sd::SeedMode::per_image;
    job.seed = 10;
    auto plan = sd::plan_run(job);
    std::vector<uint64_t> seeds;
    for (const auto& b : plan.batches) {
        ASSERT_EQ(b.images.size(), 1u);  // per-image seeds: one image a batch
        seeds.push_back(b.images[0].seed);
    }
    EXPECT_EQ(seeds, (std::vector<uint64_t>{10, 1000, 12, 13, 1001, 15}));
}

TEST(Plan, LineSeedNeedsPerImageMode) {
    auto job = file_job("{\"prompt\":\"a\",\"seed\":3}\n", true, 1, 1);
    try {
        sd::plan_run(job);
        FAIL() << "accepted";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("p:1"), std::string::npos) << e.what();
    }
}

TEST(Plan, ResumeAndShardsDefaultToIndexNames) {
    auto job = file_job("a\nb\n", false, 1, 1);
    job.seed_mode = sd::SeedMode::per_image;
    job.skip_existing = true;
    auto plan = sd::plan_run(job);
    EXPECT_EQ(plan.batches[1].images[0].name, "00001.png");
}

TEST(Names, PatternExpansion) {
    EXPECT_EQ(sd::expand_name("{index}-{seed}-{prompt}", 7, 123, "A cat, on a mat!"), "00007-123-A_cat_on_a_mat.png");
    EXPECT_EQ(sd::expand_name("x{index}.png", 3, 0, ""), "x00003.png");
    EXPECT_EQ(sd::expand_name("{prompt}", 0, 0, "../../etc/passwd"), "etc_passwd.png");
    EXPECT_EQ(sd::expand_name("{prompt}", 0, 0, "café 猫"), "café_猫.png");
    EXPECT_LE(sd::expand_name("{prompt}", 0, 0, std::string(500, 'a')).size(), 84u);
    EXPECT_THROW(sd::check_name_pattern("{idx}"), sd::Error);
    EXPECT_THROW(sd::check_name_pattern("a/{index}"), sd::Error);
    EXPECT_THROW(sd::check_name_pattern("{index"), sd::Error);
}

TEST(Metadata, ParametersTextIsA1111Style) {
    sd::PromptItem item;
    item.prompt = "a cat";
    item.negative_prompt = "blurry";
    item.settings.steps = 50;
    item.settings.scale = 7.5;
    item.settings.width = 512;
    item.settings.height = 768;
    EXPECT_EQ(sd::parameters_text(item, 42, sd::SeedMode::per_image, 3, "sd15"),
              "a cat\nNegative prompt: blurry\nSteps: 50, Sampler: PLMS, CFG scale: 7.5, Seed: 42, Size: 512x768, "
              "Model: sd15, Seed mode: per-image, Image index: 3");
    item.negative_prompt.clear();
    EXPECT_EQ(sd::parameters_text(item, 1, sd::SeedMode::compvis, 0, "m").find("Negative"), std::string::npos);
}
