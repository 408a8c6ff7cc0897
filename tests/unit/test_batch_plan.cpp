// A run's plan (run/batch_plan.h): batches, seeds, names, metadata text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "test_util.h"
#include "run/batch_plan.h"
#include "sd/from_png.h"
#include "sd/version.h"


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
    sd::PlannedImage img;
    img.seed = 42;
    img.index = 3;
    const std::string version = std::string(", Version: ") + sd::kVersionName;
    EXPECT_EQ(sd::parameters_text(item, img, sd::SeedMode::per_image, "sd15"),
              "a cat\nNegative prompt: blurry\nSteps: 50, Sampler: PLMS, CFG scale: 7.5, Seed: 42, Size: 512x768, "
              "Model: sd15, RNG: CPU, Seed mode: per-image, Image index: 3" + version);
    item.negative_prompt.clear();
    EXPECT_EQ(sd::parameters_text(item, img, sd::SeedMode::compvis, "m").find("Negative"), std::string::npos);
    // k-diffusion samplers: A1111's sampler and schedule names; compvis seeds: the batch; a model name with a comma quoted.
    item.settings.sampler = "euler_a";
    item.settings.schedule = "karras";
    item.settings.prompt_weights = false;
    img.batch_size = 3;
    img.position = 2;
    img.batch_number = 1;
    EXPECT_EQ(sd::parameters_text(item, img, sd::SeedMode::compvis, "my, model"),
              "a cat\nSteps: 50, Sampler: Euler a, Schedule type: Karras, CFG scale: 7.5, Seed: 42, Size: 512x768, "
              "Model: \"my, model\", Prompt syntax: plain, RNG: CPU, Seed mode: compvis, Image index: 3, Batch size: 3, "
              "Batch position: 2, Batch number: 1" + version);
}

// The text read back gives every setting it was written from.
TEST(Metadata, ParametersTextReadsBack) {
    sd::PromptItem item;
    item.prompt = "line one\nline (two:1.2)";
    item.negative_prompt = "blurry\ndark";
    item.settings.sampler = "dpmpp_2m";
    item.settings.schedule = "karras";
    item.settings.steps = 7;
    item.settings.scale = 3.25;
    item.settings.width = 96;
    item.settings.height = 64;
    item.settings.prompt_weights = false;
    sd::PlannedImage img;
    img.seed = 18446744073709551615ull;
    img.index = 12;
    img.batch_size = 4;
    img.position = 3;
    img.batch_number = 0;
    const auto r = sd::parse_parameters_text(sd::parameters_text(item, img, sd::SeedMode::compvis, "a, \"b\""), "x.png");
    EXPECT_EQ(r.prompt, item.prompt);
    EXPECT_EQ(r.negative_prompt, item.negative_prompt);
    EXPECT_EQ(r.sampler, "dpmpp_2m");
    EXPECT_EQ(r.schedule, "karras");
    EXPECT_EQ(r.steps, 7);
    EXPECT_EQ(r.scale, 3.25);
    EXPECT_EQ(r.width, 96);
    EXPECT_EQ(r.height, 64);
    EXPECT_EQ(r.seed, img.seed);
    EXPECT_EQ(r.seed_mode, "compvis");
    EXPECT_EQ(r.prompt_syntax, "plain");
    EXPECT_EQ(r.index, 12);
    EXPECT_EQ(r.batch_size, 4);
    EXPECT_EQ(r.batch_position, 3);
    EXPECT_EQ(r.batch_number, 0);
    EXPECT_EQ(r.model, "a, \"b\"");
    EXPECT_EQ(r.version, sd::kVersionName);
    // An A1111 text of its own: its names are read, its other keys ignored.
    const auto a = sd::parse_parameters_text(
        "a fox\nSteps: 20, Sampler: Euler a, Schedule type: Automatic, CFG scale: 7, Seed: 5, Size: 512x512, "
        "Model hash: abc, Model: sd15, Version: v1.9.4",
        "a.png");
    EXPECT_EQ(a.sampler, "euler_a");
    EXPECT_EQ(a.schedule, "automatic");  // the web UI's choice for the sampler (issue 35)
    EXPECT_FALSE(a.seed_mode.has_value());
    EXPECT_EQ(a.writer, sd::TextWriter::web_ui);
    EXPECT_THROW(sd::parse_parameters_text("a fox", "b.png"), sd::Error);
    // A sampler the catalog lacks is a field the tool cannot honour: refused by check_honoured.
    const auto c = sd::parse_parameters_text("a\nSteps: 20, Sampler: Nonesuch 3", "c.png");
    EXPECT_FALSE(c.sampler.has_value());
    EXPECT_EQ(c.unhonoured, std::vector<std::string>{"Sampler: Nonesuch 3"});
    EXPECT_THROW(sd::check_honoured(c, "c.png", false), sd::Error);
    EXPECT_EQ(sd::check_honoured(c, "c.png", true), "Sampler: Nonesuch 3");
    EXPECT_THROW(sd::parse_parameters_text("a\nSteps: many", "d.png"), sd::Error);
}

TEST(Plan, NonFiniteWeightIsRefusedUnlessTheSyntaxIsPlain) {
    auto job = file_job("{\"prompt\":\"a cat\"}\n{\"prompt\":\"b\",\"negative_prompt\":\"(blur:9999999999999999999999999999999999999999)\"}\n", true, 1, 1);
    try {
        sd::plan_run(job);
        ADD_FAILURE() << "accepted";
    } catch (const sd::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("p:2: the negative prompt: the weight of \"blur\"", 0), 0u) << e.what();
    }
    job.settings.prompt_weights = false;  // --prompt-syntax plain: brackets are text
    EXPECT_NO_THROW(sd::plan_run(job));
}
