// The memory planner, and the memory options end to end: every attention
// strategy, sequential loading and micro-batching must still reproduce the
// reference runs; VAE tiling must not leave seams.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <torch/cuda.h>

#include "engine/block_cache.h"
#include "conformance_util.h"
#include "sd/error.h"
#include "io/image_io.h"
#include "memory/planner.h"
#include "test_util.h"

using sdtest::run;

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double MiB = 1024.0 * 1024;

// The full-size SD 1.5 architecture (file sizes of a float32 export).
sd::MemoryModel sd15() {
    sd::ModelConfig c;
    c.architecture_json = R"({"unet": {"model_channels": 320, "channel_mult": [1, 2, 4, 4], "attention_resolutions": [4, 2, 1],
        "num_res_blocks": 2, "num_heads": 8, "num_head_channels": -1},
        "vae": {"ch": 128, "ch_mult": [1, 2, 4, 4]}, "text": {"ctx": 77, "width": 768, "heads": 12}})";
    auto m = sd::memory_model(c);
    m.text_weights = 492.3e6;
    m.unet_weights = 3438.5e6;
    m.vae_weights = 198.1e6;
    return m;
}

sd::MemoryRequest request(int size, int images, double budget) {
    sd::MemoryRequest r;
    r.height = r.width = size;
    r.images = images;
    r.budget = budget;
    return r;
}

std::string tiny_model() { return sdtest::test_models() + "/tiny-st"; }
std::string case_dir(const std::string& name) { return sdtest::fixtures() + "/tiny/cases/" + name; }

}  // namespace

TEST(ParseSize, UnitsAndErrors) {
    EXPECT_DOUBLE_EQ(sd::parse_size("4G"), 4 * GiB);
    EXPECT_DOUBLE_EQ(sd::parse_size("4.5GiB"), 4.5 * GiB);
    EXPECT_DOUBLE_EQ(sd::parse_size("3500M"), 3500 * MiB);
    EXPECT_DOUBLE_EQ(sd::parse_size("1024"), 1024);
    for (const char* bad : {"", "G", "-1G", "4X", "abc", "0"}) EXPECT_THROW(sd::parse_size(bad), sd::Error) << bad;
}

TEST(Planner, PlentyOfMemoryKeepsStagesResidentAndWholeBatch) {
    auto p = sd::plan_memory(sd15(), request(512, 1, 16 * GiB), 170 * MiB);
    EXPECT_FALSE(p.sequential);
    EXPECT_EQ(p.unet_rows, 2);
    EXPECT_EQ(p.vae_tile, 0);
    EXPECT_EQ(p.attention_name(), "chunked:256");
    EXPECT_LE(p.peak(), 16 * GiB);
}

TEST(Planner, ShrinkingBudgetShrinksThePlanAndEndsInRefusal) {
    const auto m = sd15();
    double last_peak = 1e30;
    bool saw_smaller_rows = false, saw_smaller_chunk = false, refused = false;
    for (double budget = 12 * GiB; budget > 1 * GiB; budget *= 0.97) {
        sd::MemoryPlan p;
        try {
            p = sd::plan_memory(m, request(1024, 4, budget), 170 * MiB);
        } catch (const sd::Error& e) {
            EXPECT_NE(std::string(e.what()).find("--max-memory"), std::string::npos) << e.what();
            refused = true;
            break;
        }
        EXPECT_LE(p.peak(), budget);
        EXPECT_LE(p.peak(), last_peak) << "a smaller budget must never get a larger plan";
        last_peak = p.peak();
        saw_smaller_rows |= p.unet_rows < 8;
        saw_smaller_chunk |= p.attention_chunk < 256;
    }
    EXPECT_TRUE(saw_smaller_rows);
    EXPECT_TRUE(refused) << "the planner should refuse before 1 GiB (the UNet weights alone are 3.2 GiB)";
    // With the UNet pass fixed by the user, the attention chunk is what shrinks.
    for (double budget = 12 * GiB; budget > 3 * GiB && !saw_smaller_chunk; budget *= 0.99) {
        auto r = request(1024, 4, budget);
        r.unet_rows = 8;
        try {
            saw_smaller_chunk |= sd::plan_memory(m, r, 170 * MiB).attention_chunk < 256;
        } catch (const sd::Error&) {
            break;
        }
    }
    EXPECT_TRUE(saw_smaller_chunk);
}

// The plan's peak with nothing kept for reuse.
double lean_peak(sd::MemoryPlan p) {
    p.text.kept = p.unet.kept = p.vae.kept = 0;
    return p.peak();
}

TEST(Planner, SequentialLoadingIsTheFirstThingGivenUp) {
    const auto m = sd15();
    auto roomy = sd::plan_memory(m, request(512, 1, 16 * GiB), 170 * MiB);
    // Just below the resident plan without freed-block reuse.
    auto tight = sd::plan_memory(m, request(512, 1, lean_peak(roomy) - 1), 170 * MiB);
    EXPECT_FALSE(roomy.sequential);
    EXPECT_TRUE(tight.sequential);
    EXPECT_EQ(tight.unet_rows, roomy.unet_rows);
    EXPECT_EQ(tight.attention_chunk, roomy.attention_chunk);
}

// The allocator behind LibTorch's large CPU blocks: a freed block comes back
// for the next request of its size, nothing beyond the limit is kept, and
// oneDNN's raw allocations (convolutions) go through it unharmed.
TEST(BlockCache, ReusesFreedBlocksUpToTheLimit) {
    sd::install_block_cache();
    sd::set_block_cache_limit(8 << 20);
    const auto start = sd::block_cache_stats();
    void* first = nullptr;
    {
        auto t = at::empty({1 << 20});  // 4 MiB
        first = t.data_ptr();
    }
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, start.cached_bytes + (4u << 20));
    {
        auto t = at::empty({1 << 20});
        EXPECT_EQ(t.data_ptr(), first);
        EXPECT_EQ(sd::block_cache_stats().hits, start.hits + 1);
    }
    { auto big = at::empty({4 << 20}); }  // 16 MiB: over the limit, back to the OS
    EXPECT_LE(sd::block_cache_stats().cached_bytes, 8u << 20);
    const auto x = at::randn({1, 32, 64, 64}), w = at::randn({64, 32, 3, 3});
    const auto y1 = at::conv2d(x, w, {}, 1, 1), y2 = at::conv2d(x, w, {}, 1, 1);
    EXPECT_TRUE(at::equal(y1, y2));
    EXPECT_GE(sd::block_cache_stats().peak_cached_bytes, 4u << 20);
    sd::drop_cached_blocks();  // between stages: everything back, the limit stays
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, 0u);
    EXPECT_EQ(sd::block_cache_stats().peak_cached_bytes, 0u);
    { auto t = at::empty({1 << 20}); }
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, 4u << 20);
    sd::set_block_cache_limit(0);
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, 0u);
}

// Freed-block reuse takes what the budget leaves over, up to the largest
// stage's working set; each stage counts what of it sits beside its peak, and
// the plan with it still fits the budget.
TEST(Planner, BlockCacheTakesTheHeadroomOnly) {
    const auto m = sd15();
    auto roomy = sd::plan_memory(m, request(512, 1, 16 * GiB), 170 * MiB);
    EXPECT_NEAR(roomy.block_cache, std::max(roomy.unet.working_set, roomy.vae.working_set), 1.0);
    EXPECT_GT(roomy.unet.kept, 0);
    EXPECT_LT(roomy.unet.kept, roomy.unet.working_set);
    EXPECT_EQ(roomy.text.kept, 0);
    EXPECT_LE(roomy.peak(), 16 * GiB);
    const double lean = lean_peak(roomy);
    EXPECT_GT(roomy.peak(), lean);
    // The last 10% of the budget stays free: the margin for the prediction's error.
    const double budget = (lean + 300 * MiB) / 0.9;
    auto some = sd::plan_memory(m, request(512, 1, budget), 170 * MiB);
    EXPECT_NEAR(some.block_cache, 300 * MiB, 1 * MiB);
    EXPECT_NEAR(some.vae.kept + some.vae.scores, 300 * MiB, 1 * MiB)
        << "the limit caps what a stage keeps, less its score blocks the cache holds";
    EXPECT_LE(some.peak(), 0.9 * budget + 1);
    auto none = sd::plan_memory(m, request(512, 1, lean / 0.9), 170 * MiB);
    EXPECT_EQ(none.block_cache, 0);
    EXPECT_EQ(none.peak(), lean);
}

// The cache never evicts: score blocks it kept after one attention hold
// their room until the next attention takes them back, and the other freed
// blocks get only what is left of the limit.
TEST(Planner, KeptScoreBlocksLeaveLessRoomForTheRest) {
    const auto m = sd15();
    auto r = request(768, 4, 16 * GiB);
    r.attention = sd::AttentionSetting{sd::AttentionMode::PerHead};
    const auto big = sd::plan_memory(m, r, 170 * MiB);
    const double block = big.unet.scores / 2;
    ASSERT_GT(block, 2 * GiB) << "8 rows x 9216^2 floats";
    ASSERT_LT(block, big.block_cache) << "one block fits the limit, two do not";
    EXPECT_NEAR(big.unet.kept, big.block_cache - block, 1.0);
    EXPECT_LT(big.unet.kept, big.unet.share_at_peak);
    // Small blocks (chunked) leave the share as it was.
    r.attention = sd::AttentionSetting{sd::AttentionMode::Chunked};
    const auto small = sd::plan_memory(m, r, 170 * MiB);
    EXPECT_NEAR(small.unet.kept, small.unet.share_at_peak, 1.0);
}

// The model against whole-run peaks measured on the full-size model
// (docs/benchmarks.md, "Per strategy": 16G budget, DDIM 1 step): each within
// the issue's 15%. A change of the model that loses the fit fails here.
TEST(Planner, PredictsTheMeasuredBenchmarkRows) {
    struct Row { int size, images, mode; double measured_gib; };  // mode: 0 full, 1 per-head, 2 chunked
    const Row rows[] = {{256, 1, 0, 4.55}, {256, 1, 1, 4.56}, {256, 1, 2, 4.55}, {256, 4, 0, 5.33}, {256, 4, 1, 4.79}, {256, 4, 2, 4.74},
                        {512, 1, 0, 6.81}, {512, 1, 1, 6.00}, {512, 1, 2, 6.01}, {512, 4, 0, 13.87}, {512, 4, 1, 7.08},
                        {512, 4, 2, 6.07}, {768, 1, 1, 9.04}, {768, 1, 2, 8.43}, {768, 4, 1, 11.21},
                        {768, 4, 2, 8.56}, {1024, 1, 1, 11.79}, {1024, 1, 2, 11.82}, {1024, 4, 1, 13.89},
                        {1024, 4, 2, 11.94}};
    for (const Row& row : rows) {
        auto r = request(row.size, row.images, 16 * GiB);
        r.attention = sd::AttentionSetting{static_cast<sd::AttentionMode>(row.mode)};
        r.sequential = false;
        const auto p = sd::plan_memory(sd15(), r, 162 * MiB);
        EXPECT_NEAR(p.peak() / (row.measured_gib * GiB), 1.0, 0.15)
            << row.size << "^2, " << row.images << " images, attention mode " << row.mode;
    }
}

TEST(Planner, RefusalNamesABudgetThatWorks) {
    const auto m = sd15();
    try {
        sd::plan_memory(m, request(512, 1, 2 * GiB), 170 * MiB);
        FAIL() << "2 GiB cannot hold 3.2 GiB of UNet weights";
    } catch (const sd::Error& e) {
        const std::string msg = e.what();
        auto pos = msg.find("--max-memory ");
        ASSERT_NE(pos, std::string::npos) << msg;
        const std::string suggested = msg.substr(pos + 13, msg.find(' ', pos + 13) - pos - 13);
        auto p = sd::plan_memory(m, request(512, 1, sd::parse_size(suggested)), 170 * MiB);
        EXPECT_TRUE(p.sequential);
    }
}

TEST(Planner, AllHeadsAtOnceCostsHeadsTimesPerHead) {
    const auto m = sd15();
    sd::MemoryPlan full, per_head;
    full.attention_mode = sd::AttentionMode::Full;
    per_head.attention_mode = sd::AttentionMode::PerHead;
    auto r = request(512, 1, 64 * GiB);
    EXPECT_NEAR(sd::predict(m, r, 0, full).unet.scores / sd::predict(m, r, 0, per_head).unet.scores, 8.0, 1e-9);
}

// The VAE's attention runs at the latent grid, before its finest level
// allocates its large activations: the two peaks do not add up.
TEST(Planner, VaeScoresDoNotStackOnItsFinestActivations) {
    const auto m = sd15();
    sd::MemoryPlan per_head;
    per_head.attention_mode = sd::AttentionMode::PerHead;
    const auto p = sd::predict(m, request(1024, 1, 64 * GiB), 0, per_head);
    EXPECT_GT(p.vae.scores, 1.9 * GiB) << "one 16384 x 16384 score matrix and its softmax";
    EXPECT_NEAR(p.vae.transient(), std::max(p.vae.activations, p.vae.scores + p.vae.beside_scores), 1.0);
    EXPECT_LT(p.vae.beside_scores, 0.1 * p.vae.activations);
    // The UNet's attention runs where its activations peak: they add up.
    EXPECT_NEAR(p.unet.transient(), p.unet.activations + p.unet.scores, 1.0);
}

TEST(Planner, HalfWeightsHalveTheUnetAndCountTheLayerCopy) {
    const auto m = sd15();
    auto r = request(512, 1, 64 * GiB);
    sd::MemoryPlan c;
    c.sequential = true;
    c.unet_rows = 1;
    const auto full = sd::predict(m, r, 0, c);
    r.half_weights = true;
    const auto half = sd::predict(m, r, 0, c);
    EXPECT_NEAR(half.unet.weights, full.unet.weights / 2, 1.0);
    EXPECT_NEAR(half.vae.weights, full.vae.weights / 2, 1.0);
    EXPECT_NEAR(half.text.weights, full.text.weights, 1.0) << "the text encoder stays fp32";
    EXPECT_GT(half.unet.activations, full.unet.activations) << "the widened copy of the running layer";
    // Loading an fp32 file holds all of it before the conversion: that is the UNet's peak then.
    EXPECT_NEAR(half.unet.total(0), m.unet_weights, 1.0);
    // From an fp16 file, nothing is converted and the steady state is the peak.
    auto m16 = m;
    m16.half_file = true;
    m16.unet_weights /= 2;
    const auto from16 = sd::predict(m16, r, 0, c);
    EXPECT_NEAR(from16.unet.weights, half.unet.weights, 1.0);
    EXPECT_LT(from16.unet.total(0), 0.6 * full.unet.total(0));
    // ... and widened to fp32 at load it costs what an fp32 file costs.
    r.half_weights = false;
    EXPECT_NEAR(sd::predict(m16, r, 0, c).unet.total(0), full.unet.total(0), 1.0);
}

TEST(Planner, TightBudgetSuggestsHalfWeights) {
    try {
        sd::plan_memory(sd15(), request(512, 1, 2.5 * GiB), 170 * MiB);
        FAIL() << "2.5 GiB cannot hold 3.2 GiB of fp32 UNet weights";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("--weights fp16"), std::string::npos) << e.what();
    }
    auto r = request(512, 1, 2.5 * GiB);
    r.half_weights = true;
    auto m16 = sd15();
    m16.half_file = true;
    m16.unet_weights /= 2;
    m16.vae_weights /= 2;
    EXPECT_NO_THROW(sd::plan_memory(m16, r, 170 * MiB));
}

// ---- end to end on the tiny model ----

struct MemoryConformance : ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(MemoryConformance, MatchesReferenceRun) {
    const auto& [name, attention, sequential] = GetParam();
    sdtest::check_cli_case(case_dir(name), tiny_model(),
                           {"--attention", attention, "--sequential-load", sequential, "--threads", "1"});
}

INSTANTIATE_TEST_SUITE_P(
    TinyCases, MemoryConformance,
    ::testing::Combine(::testing::Values("p1_plms50_64x64", "p2_plms10_64x96", "p3_ddim10_64x64", "p4_plms10_batch2_64x64"),
                       ::testing::Values("full", "per-head", "chunked:16", "auto"), ::testing::Values("on", "off")),
    [](const auto& info) {
        std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_seq_" + std::get<2>(info.param);
        for (auto& ch : s)
            if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
        return s;
    });

// The fixture's weights are fp16-representable, so an fp16 export must give
// the reference run both when widened at load and when each layer widens its
// weights as it runs (--weights fp16).
struct HalfWeightFile : ::testing::TestWithParam<std::string> {};

TEST_P(HalfWeightFile, MatchesReferenceRun) {
    sdtest::check_cli_case(case_dir("p4_plms10_batch2_64x64"), sdtest::test_models() + "/tiny-f16",
                           {"--weights", GetParam(), "--threads", "1"});
}

INSTANTIATE_TEST_SUITE_P(TinyCases, HalfWeightFile, ::testing::Values("fp32", "fp16"));

TEST(HalfWeights, Fp32FileHeldInFp16MatchesReferenceRun) {
    sdtest::check_cli_case(case_dir("p3_ddim10_64x64"), tiny_model(), {"--weights", "fp16", "--threads", "1"});
}

// The plan the run follows holds the UNet in half (the saving itself is
// measured on the full-size model, docs/benchmarks.md).
TEST(HalfWeights, PlanHoldsTheUnetInHalf) {
    auto unet_weights = [&](const std::string& weights) {
        auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan",
                      "--weights", weights});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        for (const auto& line : sdtest::lines(r.out))
            if (line.find("unet") != std::string::npos) return line.substr(line.find("weights"), line.find(',') - line.find("weights"));
        return std::string("no unet line in ") + r.out;
    };
    const std::string full = unet_weights("fp32"), half = unet_weights("fp16");
    EXPECT_NE(full, half);
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan", "--weights", "fp16"});
    EXPECT_NE(r.out.find("weights held in fp16"), std::string::npos) << r.out;
}

TEST(HalfWeights, UnknownWeightTypeIsRefused) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--weights", "int8", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("--weights"), std::string::npos) << r.err;
}

TEST(MicroBatch, OneImagePerPassMatchesTheBatchOfTwo) {
    sdtest::check_cli_case(case_dir("p4_plms10_batch2_64x64"), tiny_model(), {"--batch-size", "1", "--threads", "1"});
}

TEST(PlanFlag, PrintsEveryStageAndExits) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* s : {"text encoder", "unet", "vae decoder", "predicted peak"})
        EXPECT_NE(r.out.find(s), std::string::npos) << r.out;
}

TEST(PlanFlag, TooSmallBudgetIsRefusedWithTheBudgetThatWouldWork) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--max-memory", "20M",
                  "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("not enough memory"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--max-memory"), std::string::npos) << r.err;
}

TEST(VerboseSummary, PredictedAndMeasuredPeaksAndLoadTimes) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--steps", "2",
                  "--sampler", "ddim", "--quiet", "--verbose", "--outdir", sdtest::temp_dir()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* stage : {"text encoder peak: predicted", "unet         peak: predicted", "vae decoder  peak: predicted"})
        EXPECT_NE(r.err.find(stage), std::string::npos) << r.err;
    double text = -1, unet = -1, vae = -1, encode = -1, first = -1;
    const auto pos = r.err.find("timing: ");
    ASSERT_NE(pos, std::string::npos) << r.err;
    ASSERT_EQ(std::sscanf(r.err.c_str() + pos,
                          "timing: text encoder load %lf s, UNet load %lf s, VAE load %lf s, first prompts encoded in "
                          "%lf s, start to first step %lf s",
                          &text, &unet, &vae, &encode, &first), 5)
        << r.err;
    // Both loads and the encoding happen before the first step, and the process start before them.
    EXPECT_GT(first, 0);
    EXPECT_GE(encode, 0);
    EXPECT_GE(first + 0.03, text + unet + encode) << r.err;  // /proc's clock ticks are 10 ms
    EXPECT_GE(vae, 0);
}

TEST(Precision, HalfComputeIsRefusedOnCpuWithTheReason) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--precision", "fp16", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("CPU"), std::string::npos) << r.err;
    r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--precision", "fp8", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("unknown --precision 'fp8'"), std::string::npos) << r.err;
}

// bf16 compute runs on a CPU (slowly), through the same path as fp16 on a GPU:
// inputs cast to the compute dtype, scores, softmax and norms in fp32, results
// back in fp32. Its latents must differ from fp32's (the compute really was
// bf16) yet stay near the reference: measured 12.7% relative RMS on this
// random-weight model, whose single UNet call already drifts 7% in bf16.
TEST(Precision, BfloatComputeRunsOnCpuNearTheReference) {
    const std::string dir = case_dir("p3_ddim10_64x64");
    auto args = sdtest::read_json(dir + "/args.json");
    const std::string out = sdtest::temp_dir();
    auto cmd = sdtest::case_cli_args(args, tiny_model(), out);  // the CLI and the case's flags
    for (const char* a : {"--precision", "bf16", "--threads", "1", "--save-latents"}) cmd.push_back(a);
    cmd.push_back(out + "/latents.npy");
    auto r = run(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("slower than fp32"), std::string::npos) << r.err;
    const auto ref = sdtest::load_tensor(dir + "/latents.npy");
    const auto got = sdtest::load_tensor(out + "/latents.npy");
    ASSERT_EQ(ref.sizes(), got.sizes());
    const double rel = ((got - ref).norm() / ref.norm()).item<double>();
    EXPECT_GT(sdtest::max_abs_diff(got, ref), 1e-3) << "identical to fp32: bf16 was not used";
    EXPECT_LT(rel, 0.25);
}

TEST(Device, UnknownOrMissingDevicesAreRefusedInOneLine) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--device", "tpu", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("unknown --device 'tpu'"), std::string::npos) << r.err;
    if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA GPU is visible";
    r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--device", "cuda", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("no CUDA GPU"), std::string::npos) << r.err;
    // auto falls back to the CPU, in fp32.
    r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("compute: fp32 on cpu, weights held in fp32"), std::string::npos) << r.out;
}

// Tiled decoding of a 256x256 image in 16-latent-pixel tiles: close to the
// whole-image decode, and no step at the tile borders larger than the image's
// own texture.
TEST(VaeTiling, TilesBlendWithoutSeams) {
    auto gen = [&](const std::string& tiling) {
        const std::string out = sdtest::temp_dir();
        auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "a house", "--H", "256", "--W", "256", "--steps", "4",
                      "--threads", "1", "--quiet", "--vae-tiling", tiling, "--outdir", out});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return sd::read_png(sdtest::lines(r.out).at(0));
    };
    auto whole = gen("off"), tiled = gen("16");
    ASSERT_EQ(whole.rgb.size(), tiled.rgb.size());
    double sum = 0;
    for (size_t i = 0; i < whole.rgb.size(); ++i) sum += std::abs(int(whole.rgb[i]) - int(tiled.rgb[i]));
    const double mean_diff = sum / static_cast<double>(whole.rgb.size());
    EXPECT_LT(mean_diff, 8.0) << "tiled decode strays from the whole-image decode";
    // Horizontal steps between neighbouring columns: at the tiles' overlap
    // centres versus everywhere, relative to the same columns of the whole decode.
    auto column_step = [](const sd::Image& im, int x) {
        double s = 0;
        for (int y = 0; y < im.height; ++y)
            for (int c = 0; c < 3; ++c)
                s += std::abs(int(im.rgb[(y * im.width + x + 1) * 3 + c]) - int(im.rgb[(y * im.width + x) * 3 + c]));
        return s;
    };
    double worst_ratio = 0;
    for (int x = 0; x + 1 < tiled.width; ++x)
        worst_ratio = std::max(worst_ratio, column_step(tiled, x) / std::max(1.0, column_step(whole, x)));
    EXPECT_LT(worst_ratio, 1.5) << "a column step in the tiled image is much larger than in the whole decode";
}
