// Progress text (sd/progress.h), and the step times a run reports.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "sd/error.h"
#include "sd/pipeline.h"
#include "sd/progress.h"
#include "sd/txt2img.h"
#include "test_util.h"

TEST(Progress, TextHasImagesStepSpeedAndEta) {
    sd::ProgressInfo p;
    p.first_image = 4;
    p.batch_images = 3;
    p.total_images = 21;
    p.step = 12;
    p.steps = 50;
    p.seconds_per_step = 1.234;
    p.eta_seconds = 245;
    EXPECT_EQ(sd::progress_text(p), "images 4-6/21  step 12/50  1.23 s/step  ETA 4m05s");
    p.batch_images = 1;
    p.eta_seconds = 3725;
    EXPECT_EQ(sd::progress_text(p), "image 4/21  step 12/50  1.23 s/step  ETA 1h02m");
}

// A pipeline that takes `load_seconds` before its first batch samples (as loading
// the stages does), `decode_seconds` after each batch's steps (as decoding does)
// and no time for its steps.
class SlowStartPipeline final : public sd::Pipeline {
public:
    SlowStartPipeline(double load_seconds, double decode_seconds)
        : load_seconds_(load_seconds), decode_seconds_(decode_seconds) {
        config_.alphas_cumprod.assign(1000, 0.5f);
    }
    const sd::ModelConfig& config() const override { return config_; }
    const sd::ComputeChoice& compute() const override { return compute_; }
    void check(const sd::GenerateSettings&) const override {}
    sd::MemoryPlan plan(const sd::GenerateSettings&, int) const override { return {}; }
    const sd::StagePeaks& measured() const override { return peaks_; }
    const sd::StageTimes& timings() const override { return times_; }
    void seed(uint64_t) override {}
    void set_preview(sd::PreviewFn) override {}
    sd::BatchOutput generate(const std::vector<std::string>& prompts, const sd::GenerateSettings& s,
                             const sd::ProgressFn& progress) override {
        std::this_thread::sleep_for(std::chrono::duration<double>(load_seconds_));
        load_seconds_ = 0;  // loaded once
        progress(0, 0);
        for (int i = 1; i <= s.steps; ++i) progress(i, s.steps);
        std::this_thread::sleep_for(std::chrono::duration<double>(decode_seconds_));
        sd::BatchOutput out;
        for (size_t i = 0; i < prompts.size(); ++i)
            out.images.push_back({s.width, s.height, std::vector<uint8_t>(static_cast<size_t>(s.width * s.height * 3))});
        return out;
    }

private:
    double load_seconds_, decode_seconds_;
    sd::ModelConfig config_;
    sd::ComputeChoice compute_;
    sd::StagePeaks peaks_;
    sd::StageTimes times_;
};

// Runs the prompts (a file's lines, one image a batch) through the pipeline, 4 DDIM steps
// at 8x8; the progress reports it made; the images written must be one per prompt.
std::vector<sd::ProgressInfo> run_reports(sd::Pipeline& pipeline, const std::vector<std::string>& prompts) {
    sd::Txt2ImgJob job;
    job.from_file = true;
    for (size_t i = 0; i < prompts.size(); ++i) job.prompts.push_back(sd::PromptLine{prompts[i], int(i) + 1});
    job.settings.sampler = "ddim";
    job.settings.steps = 4;
    job.settings.width = job.settings.height = 8;
    job.outdir = sdtest::temp_dir();
    std::vector<sd::ProgressInfo> reports;
    sd::Txt2ImgEvents events;
    events.progress = [&](const sd::ProgressInfo& p) { reports.push_back(p); };
    EXPECT_EQ(sd::run_txt2img(pipeline, job, events).written.size(), prompts.size());
    return reports;
}

TEST(Progress, StepTimesLeaveTheLoadingBeforeSamplingOut) {
    SlowStartPipeline pipeline(1.0, 0.0);
    const auto reports = run_reports(pipeline, {"a cat"});
    ASSERT_EQ(reports.size(), 4u) << "one report per step, none for the start";
    for (const auto& p : reports) {
        EXPECT_GE(p.step, 1);
        // The steps take microseconds; the second before them must not be counted in.
        EXPECT_LT(p.seconds_per_step, 0.5) << "step " << p.step;
        EXPECT_LT(p.eta_seconds, 1.0) << "step " << p.step;
    }
}

// The ETA counts what each batch takes besides its steps (decoding, writing), as
// measured from the first step on, and not the loading before it.
TEST(Progress, EtaCountsTheTimeBetweenBatchesButNotTheLoading) {
    SlowStartPipeline pipeline(2.0, 0.5);
    const auto reports = run_reports(pipeline, {"a cat", "a dog", "a cow"});
    ASSERT_EQ(reports.size(), 12u);
    // The second batch's first step: its own decode and the third batch's are to come, 0.5 s each.
    const sd::ProgressInfo& second = reports[4];
    ASSERT_EQ(second.first_image, 2);
    EXPECT_GT(second.eta_seconds, 0.8) << "the time between batches is left out";
    EXPECT_LT(second.eta_seconds, 3.0) << "the loading before the first step is counted in";
    EXPECT_LT(reports.back().eta_seconds, second.eta_seconds);
}
