// The memory planner (memory/planner.h): predictions against measured peaks,
// what it gives up as the budget shrinks, and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "sd/error.h"
#include "io/image_io.h"
#include "memory/planner.h"
#include "planner_models.h"
#include "test_util.h"

using sdtest::run;

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double MiB = 1024.0 * 1024;

sd::MemoryModel sd15() { return sdtest::sd15_memory_model(); }

sd::MemoryRequest request(int size, int images, double budget) {
    sd::MemoryRequest r;
    r.height = r.width = size;
    r.images = images;
    r.budget = budget;
    return r;
}

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

// (After the Winograd weights: WinogradWeightsAreCountedAndGoFirst.)
TEST(Planner, SequentialLoadingIsTheFirstThingGivenUp) {
    const auto m = sd15();
    auto ask = [](double budget) {
        auto r = request(512, 1, budget);
        r.winograd = false;
        return r;
    };
    auto roomy = sd::plan_memory(m, ask(16 * GiB), 170 * MiB);
    // Just below the resident plan without freed-block reuse.
    auto tight = sd::plan_memory(m, ask(lean_peak(roomy) - 1), 170 * MiB);
    EXPECT_FALSE(roomy.sequential);
    EXPECT_TRUE(tight.sequential);
    EXPECT_EQ(tight.unet_rows, roomy.unet_rows);
    EXPECT_EQ(tight.attention_chunk, roomy.attention_chunk);
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
    r.winograd = false;  // its weights would take the headroom the blocks are sized against
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
// the 15%. A change of the model that loses the fit fails here.
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
        r.prepack = false;  // measured with dense convolution weights
        const auto p = sd::plan_memory(sd15(), r, 162 * MiB);
        EXPECT_NEAR(p.peak() / (row.measured_gib * GiB), 1.0, 0.15)
            << row.size << "^2, " << row.images << " images, attention mode " << row.mode;
    }
}

// Prepacked convolutions are faster but copy activations into oneDNN's
// layout: at 512x512 under 3.5 GiB (full-size SD 1.5, fused attention) the
// UNet stage measured over the budget with them and under it without, so the
// planner keeps them where there is room and drops them before a smaller pass.
TEST(Planner, PrepackIsDroppedWhenTheBudgetNeedsTheRoom) {
    auto m = sd15();
    m.fused_attention = true;
    const auto roomy = sd::plan_memory(m, request(512, 1, 16 * GiB), 163 * MiB);
    EXPECT_TRUE(roomy.prepack);
    auto r = request(512, 1, 3.5 * GiB);
    const auto tight = sd::plan_memory(m, r, 163 * MiB);
    EXPECT_FALSE(tight.prepack);
    EXPECT_LE(tight.peak(), 3.5 * GiB);
    sd::MemoryPlan packed = tight;
    packed.prepack = true;
    EXPECT_GT(sd::predict(m, r, 163 * MiB, packed).peak(), 3.5 * GiB);
    EXPECT_GT(sd::predict(m, r, 163 * MiB, packed).vae.activations, tight.vae.activations);
    // The user's word stands: --prepack off is never overridden, and --prepack
    // on under 3.5 GiB is refused (it does not fit) rather than dropped.
    r.budget = 16 * GiB;
    r.prepack = false;
    EXPECT_FALSE(sd::plan_memory(m, r, 163 * MiB).prepack);
    r.budget = 3.5 * GiB;
    r.prepack = true;
    try {
        sd::plan_memory(m, r, 163 * MiB);
        FAIL() << "--prepack on does not fit 3.5 GiB at 512x512";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("prepacked convolutions"), std::string::npos) << e.what();
    }
}

// Winograd weights (the 3x3 convolutions of the UNet's first two levels, 4x their
// size) are the first thing a shrinking budget gives up, the second level's first,
// before resident stages.
TEST(Planner, WinogradWeightsAreCountedAndGoFirst) {
    auto m = sd15();
    m.fused_attention = true;
    // SD 1.5: fourteen 320x320 3x3 convolutions' worth at the first level, each
    // 14,745,600 bytes in oneDNN's F(4x4, 3x3) layout, and fourteen 640x640 ones'
    // (58,982,400 bytes each) at the second (its DNNL_VERBOSE weight reorders).
    ASSERT_EQ(m.unet_winograd_bytes.size(), 2u);
    EXPECT_DOUBLE_EQ(m.unet_winograd_bytes[0], 14 * 14745600.0);
    EXPECT_DOUBLE_EQ(m.unet_winograd_bytes[1], 14 * 58982400.0);
    EXPECT_EQ(m.unet_level_channels, (std::vector<int>{320, 640}));
    const auto roomy = sd::plan_memory(m, request(512, 1, 16 * GiB), 163 * MiB);
    EXPECT_TRUE(roomy.prepack);
    EXPECT_EQ(roomy.winograd_levels, 2);
    auto r = request(512, 1, 16 * GiB);
    auto peak_with = [&](int levels) {
        sd::MemoryPlan p = roomy;
        p.winograd_levels = levels;
        return lean_peak(sd::predict(m, r, 163 * MiB, p));
    };
    EXPECT_NEAR(peak_with(2) - peak_with(1), m.unet_winograd_bytes[1], 1.0);
    EXPECT_NEAR(peak_with(1) - peak_with(0), m.unet_winograd_bytes[0], 1.0);
    // A little too little room for both levels: the second goes, and nothing else does.
    r.budget = peak_with(2) - 0.5 * m.unet_winograd_bytes[1];
    auto tight = sd::plan_memory(m, r, 163 * MiB);
    EXPECT_EQ(tight.winograd_levels, 1);
    EXPECT_TRUE(tight.prepack);
    EXPECT_FALSE(tight.sequential);
    EXPECT_EQ(tight.unet_rows, roomy.unet_rows);
    // Too little for the first level's too: none.
    r.budget = peak_with(1) - 0.5 * m.unet_winograd_bytes[0];
    tight = sd::plan_memory(m, r, 163 * MiB);
    EXPECT_EQ(tight.winograd_levels, 0);
    EXPECT_FALSE(tight.sequential);
    // --winograd on keeps both levels: something else gives; off, and no prepacking, none.
    r.winograd = true;
    const auto kept = sd::plan_memory(m, r, 163 * MiB);
    EXPECT_EQ(kept.winograd_levels, 2);
    EXPECT_TRUE(kept.sequential || kept.unet_rows < roomy.unet_rows);
    r.budget = 16 * GiB;
    EXPECT_EQ(sd::plan_memory(m, r, 163 * MiB).winograd_levels, 2);
    r.winograd = false;
    EXPECT_EQ(sd::plan_memory(m, r, 163 * MiB).winograd_levels, 0);
    // A UNet that stays loaded is planned with the slots it holds.
    r.winograd.reset();
    r.winograd_levels = 1;
    EXPECT_EQ(sd::plan_memory(m, r, 163 * MiB).winograd_levels, 1);
    r.winograd_levels.reset();
    r.prepack = false;
    EXPECT_EQ(sd::plan_memory(m, r, 163 * MiB).winograd_levels, 0);
}

// The own F(2x2, 3x3) route (AVX2) holds 16 floats in place of a weight's 9, where
// oneDNN's adds 36: its levels cost 7/36 as much, so a budget too tight for oneDNN's
// form keeps them.
TEST(Planner, OwnWinogradWeightsAreCountedAtTheirSize) {
    auto m = sd15();
    m.fused_attention = true;
    auto r = request(512, 1, 16 * GiB);
    r.winograd_added_floats = 7;
    const auto roomy = sd::plan_memory(m, r, 163 * MiB);
    ASSERT_EQ(roomy.winograd_levels, 2);
    auto peak_with = [&](int levels) {
        sd::MemoryPlan p = roomy;
        p.winograd_levels = levels;
        return lean_peak(sd::predict(m, r, 163 * MiB, p));
    };
    EXPECT_NEAR(peak_with(2) - peak_with(0), (m.unet_winograd_bytes[0] + m.unet_winograd_bytes[1]) * 7 / 36, 1.0);
    // Room for both levels at 7 floats but not at 36: kept at 7, the second given up at 36.
    r.budget = peak_with(2) + 0.1 * m.unet_winograd_bytes[1];
    EXPECT_EQ(sd::plan_memory(m, r, 163 * MiB).winograd_levels, 2);
    r.winograd_added_floats = 36;
    EXPECT_LT(sd::plan_memory(m, r, 163 * MiB).winograd_levels, 2);
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

TEST(Planner, FusedAttentionFirstWhereTheModulesHaveIt) {
    auto m = sd15();
    m.fused_attention = true;
    const auto p = sd::plan_memory(m, request(512, 1, 16 * GiB), 170 * MiB);
    EXPECT_EQ(p.attention_name(), "fused");
    // It holds a padded copy of k and v (as much as 320-row chunks of scores), not n x n scores.
    sd::MemoryPlan per_head;
    per_head.attention_mode = sd::AttentionMode::PerHead;
    const auto r = request(512, 1, 64 * GiB);
    EXPECT_NEAR(sd::predict(m, r, 0, p).unet.scores, 2.0 * 2 * 4096 * 320 * 4, 1.0);
    EXPECT_LT(sd::predict(m, r, 0, p).unet.scores * 10, sd::predict(m, r, 0, per_head).unet.scores);
    EXPECT_EQ(sd::parse_attention("fused").mode, sd::AttentionMode::Fused);
}

TEST(Planner, FusedAttentionOnAnOlderExportIsRefused) {
    auto r = request(512, 1, 16 * GiB);
    r.attention = sd::parse_attention("fused");
    try {
        sd::plan_memory(sd15(), r, 170 * MiB);
        FAIL() << "the folder's modules do not call sd::attention";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("export"), std::string::npos) << e.what();
    }
    r.attention.reset();
    EXPECT_EQ(sd::plan_memory(sd15(), r, 170 * MiB).attention_name(), "chunked:256");
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
    // Narrowing an fp32 file converts tensor by tensor, each dropping its file pages:
    // the load holds the fp16 weights and one fp32 tensor, not the whole file.
    EXPECT_NEAR(half.unet.load, half.unet.weights + m.unet_largest_conv_bytes, 1.0);
    EXPECT_LT(half.unet.total(0), 0.75 * m.unet_weights);
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

// --precision bf16 holds the text encoder in bf16 too: half its fp32 bytes, from an fp32 file
// (narrowed tensor by tensor) or a bf16 one (mapped as it is).
TEST(Planner, BfloatRunHoldsTheTextEncoderInHalf) {
    const auto m = sd15();
    auto r = request(512, 1, 64 * GiB);
    sd::MemoryPlan c;
    c.sequential = true;
    c.unet_rows = 1;
    r.half_weights = true;
    const auto fp32_text = sd::predict(m, r, 0, c);
    r.half_text = true;
    const auto bf16_text = sd::predict(m, r, 0, c);
    EXPECT_NEAR(bf16_text.text.weights, fp32_text.text.weights / 2, 1.0);
    EXPECT_NEAR(bf16_text.unet.weights, fp32_text.unet.weights, 1.0) << "the UNet was half already";
    auto m16 = m;  // a bf16 export: every file half the bytes
    m16.half_file = true;
    m16.text_weights /= 2;
    m16.unet_weights /= 2;
    const auto mapped = sd::predict(m16, r, 0, c);
    EXPECT_NEAR(mapped.text.weights, bf16_text.text.weights, 1.0);
    EXPECT_NEAR(mapped.text.load, mapped.text.weights, 1.0) << "nothing converted: the mapped file is the weights";
    EXPECT_LT(mapped.unet.load, bf16_text.unet.load) << "no fp32 tensor narrowed beside the bf16 ones";
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


// LoRA merging adds to the loading peak of its stage, and nothing else: each merged weight
// takes its mapped original's place in the type the stage holds, so only the largest copy,
// change and converted result add; for 8-bit layers every fp32 copy adds.
TEST(Planner, LoraMergeCountsAtLoad) {
    auto r = request(512, 1, 16 * GiB);
    const auto plain = sd::plan_memory(sd15(), r, 170 * MiB);
    r.unet_lora = {700 * MiB, 40 * MiB, 30 * MiB};
    r.text_lora = {30 * MiB, 4 * MiB, 2 * MiB};
    const auto p = sd::predict(sd15(), r, 170 * MiB, plain);
    const auto q = sd::predict(sd15(), request(512, 1, 16 * GiB), 170 * MiB, plain);
    EXPECT_DOUBLE_EQ(p.unet.load - q.unet.load, 70 * MiB);  // held in fp32
    EXPECT_DOUBLE_EQ(p.text.load - q.text.load, 6 * MiB);
    EXPECT_DOUBLE_EQ(p.unet.weights, q.unet.weights);
    // fp16 weights, from an fp32 file and from an fp16 one; bf16 text encoders; 8-bit UNet layers.
    for (bool half_file : {false, true}) {
        auto m = sd15();
        m.half_file = half_file;
        auto rh = r, qh = request(512, 1, 16 * GiB);
        rh.half_weights = qh.half_weights = true;
        EXPECT_DOUBLE_EQ(sd::predict(m, rh, 170 * MiB, plain).unet.load - sd::predict(m, qh, 170 * MiB, plain).unet.load,
                         85 * MiB)
            << half_file;
        rh.half_text = qh.half_text = true;
        EXPECT_DOUBLE_EQ(sd::predict(m, rh, 170 * MiB, plain).text.load - sd::predict(m, qh, 170 * MiB, plain).text.load,
                         7 * MiB)
            << half_file;
    }
    auto rq = r, qq = request(512, 1, 16 * GiB);
    rq.q8_weights = qq.q8_weights = true;
    EXPECT_DOUBLE_EQ(sd::predict(sd15(), rq, 170 * MiB, plain).unet.load - sd::predict(sd15(), qq, 170 * MiB, plain).unet.load,
                     740 * MiB);
    // Sequential loading: the UNet's load is its stage's peak when the merge is large (8-bit).
    r.unet_lora = {16 * GiB, 100 * MiB, 100 * MiB};
    r.q8_weights = true;
    auto s = plain;
    s.sequential = true;
    EXPECT_GT(sd::predict(sd15(), r, 170 * MiB, s).peak(), sd::predict(sd15(), qq, 170 * MiB, s).peak() + 4 * GiB);
}

// bf16's Winograd convolutions keep their scratch while the UNet is loaded: counted with
// its weights, so a plan that holds the UNet beside the VAE holds it there too.
TEST(Planner, UnetScratchIsCountedWithItsWeights) {
    auto r = request(512, 1, 16 * GiB);
    const auto plain = sd::plan_memory(sd15(), r, 170 * MiB);
    r.unet_scratch_bytes = 60 * MiB;
    const auto p = sd::predict(sd15(), r, 170 * MiB, plain);
    const auto q = sd::predict(sd15(), request(512, 1, 16 * GiB), 170 * MiB, plain);
    EXPECT_DOUBLE_EQ(p.unet.weights - q.unet.weights, 60 * MiB);
    EXPECT_DOUBLE_EQ(p.peak() - q.peak(), 60 * MiB);
    EXPECT_GT(sd::conv_split_bytes(), 0);
}

TEST(VerboseReport, GivesTheWholeRunPeakAsTheLargestStage) {
    const auto plan = sd::plan_memory(sd15(), request(512, 1, 16 * GiB), 170 * MiB);
    sd::StagePeaks m;
    m.text = static_cast<long long>(0.6 * GiB);
    m.unet = static_cast<long long>(3.25 * GiB);
    m.vae = static_cast<long long>(1.5 * GiB);
    const std::string report = sd::measurement_report(plan, m, sd::StageTimes{}, false);
    const auto at = report.find("whole run peak: predicted " + sd::format_size(plan.peak()));
    ASSERT_NE(at, std::string::npos) << report;
    const std::string line = report.substr(at, report.find('\n', at) - at);
    EXPECT_NE(line.find("measured " + sd::format_size(3.25 * GiB)), std::string::npos) << line;
    m.encode = static_cast<long long>(4 * GiB);  // the VAE encoder's stage counts too
    EXPECT_NE(sd::measurement_report(plan, m, sd::StageTimes{}, false).find("measured " + sd::format_size(4 * GiB)),
              std::string::npos);
}
