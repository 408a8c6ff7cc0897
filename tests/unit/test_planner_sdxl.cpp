// The memory planner on the full-size SDXL base at 1024x1024 (memory/planner.h),
// against the peaks measured by --verbose (each stage's VmHWM) in
// docs/benchmarks.md ("Full-size SDXL at 1024²"): a budget's plan must not
// predict less than the run then took.
#include <gtest/gtest.h>

#include "memory/planner.h"

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double KiB = 1024.0;
constexpr double MiB = 1024.0 * 1024;
constexpr double kBase = 165 * MiB;  // the process base those runs printed

// sgm's sd_xl_base.yaml sizes, with the file sizes of the fp16 random export
// (bench/bench_sdxl.sh --budgets): .pt plus .weights per stage.
sd::MemoryModel sdxl_fp16_files() {
    sd::ModelConfig c;
    c.architecture_json = R"({"unet": {"model_channels": 320, "channel_mult": [1, 2, 4], "attention_resolutions": [4, 2],
        "num_res_blocks": 2, "num_heads": -1, "num_head_channels": 64},
        "vae": {"ch": 128, "ch_mult": [1, 2, 4, 4]}, "text": {"ctx": 77, "width": 768, "heads": 12},
        "text_2": {"ctx": 77, "width": 1280, "heads": 20}})";
    auto m = sd::memory_model(c);
    m.text_weights = 66346.0 + 231966464.0 + 167688.0 + 1389382208.0;
    m.unet_weights = 700364.0 + 5135137544.0;
    m.vae_weights = 112139.0 + 98994542.0;
    m.vae_encoder_weights = 105197.0 + 68338272.0;
    m.half_file = true;
    m.fused_attention = true;
    return m;
}

sd::MemoryRequest at_1024(double budget) {
    sd::MemoryRequest r;
    r.height = r.width = 1024;
    r.budget = budget;
    r.prepack = false;  // as the pipeline asks for fp16 and q8 weights: prepacking is for fp32 only
    return r;
}

}  // namespace

// --weights q8 --max-memory 4.5G: the VAE decoder is the largest stage, measured at
// 4,586,380 KiB (--verbose's stages: 3.20, 3.24, 4.37 GiB), with no freed blocks kept
// (the budget leaves the cache nothing); /usr/bin/time -v of a run without --verbose:
// 4,592,336 KiB. The plan of 8 floats per pixel and ch predicted 4.35 GiB.
TEST(PlannerSdxl, Q8At1024FitsFourAndAHalfGiBWithoutUnderPredicting) {
    auto r = at_1024(4.5 * GiB);
    r.q8_weights = true;
    const auto p = sd::plan_memory(sdxl_fp16_files(), r, kBase);
    EXPECT_EQ(p.attention_name(), "fused");
    EXPECT_EQ(p.unet_rows, 2) << "the guided pair in one pass";
    EXPECT_EQ(p.vae_tile, 0) << "the whole image, as measured";
    EXPECT_TRUE(p.sequential);
    EXPECT_DOUBLE_EQ(p.block_cache, 0.0);
    EXPECT_GE(p.peak(), 4592336 * KiB);
    EXPECT_GE(p.vae.total(p.base), 4586380 * KiB);
    EXPECT_LE(p.peak(), 4.5 * GiB);
}

// --weights fp16 --max-memory 7G at 1024², txt2img and img2img at strength 0.5 (--verbose's
// per-stage peaks): the VAE decoder stage measured 4.94 and 5.00 GiB with 756 MiB of freed
// blocks kept, the whole limit; the UNet stage 5.73 and 6.13 GiB, the runs' peaks (img2img
// without --verbose, 2 steps at strength 0.5: 6,428,544 KiB by /usr/bin/time -v). Fused
// attention leaves no score blocks to hold part of the limit, so each stage's share is the
// limit (the VAE was planned with the limit less 192 MiB: 4.80 GiB).
TEST(PlannerSdxl, Fp16Img2ImgAt1024CountsTheWholeCacheBesideTheVae) {
    auto r = at_1024(7 * GiB);
    r.half_weights = true;
    r.encode = true;
    const auto p = sd::plan_memory(sdxl_fp16_files(), r, kBase);
    ASSERT_EQ(p.attention_name(), "fused");
    EXPECT_EQ(p.vae_tile, 0);
    EXPECT_TRUE(p.encode);
    EXPECT_GT(p.block_cache, 0.0);
    EXPECT_DOUBLE_EQ(p.vae.kept, p.block_cache) << "no score blocks in fused attention";
    EXPECT_DOUBLE_EQ(p.unet.kept, p.block_cache);
    EXPECT_GE(p.vae.total(p.base), 5.00 * GiB);
    EXPECT_GE(p.unet.total(p.base), 6.13 * GiB);
    EXPECT_GE(p.peak(), 6428544 * KiB);
    EXPECT_LE(p.peak(), 7 * GiB);
}

// Per-head attention still holds its score blocks: the cap on the other blocks stays.
TEST(PlannerSdxl, ScoreBlocksStillCapTheShareOutsideFusedAttention) {
    auto r = at_1024(7 * GiB);
    r.half_weights = true;
    r.attention = sd::parse_attention("chunked:256");
    const auto p = sd::plan_memory(sdxl_fp16_files(), r, kBase);
    ASSERT_GT(p.block_cache, 0.0);
    EXPECT_LT(p.vae.kept, p.block_cache);
}
