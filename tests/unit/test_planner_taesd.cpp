// The planner with a TAESD in place of the VAE (--vae-decoder taesd:): its
// weights and 64-channel full-size activations, and no tiling.
#include <gtest/gtest.h>

#include "memory/planner.h"
#include "planner_models.h"

namespace {

constexpr double MiB = 1024.0 * 1024;

sd::MemoryModel sd15() { return sdtest::sd15_memory_model(); }

sd::MemoryRequest request(int size, double budget) {
    sd::MemoryRequest r;
    r.height = r.width = size;
    r.budget = budget;
    return r;
}

}  // namespace

TEST(PlannerTaesd, VaeStageIsTheTaesds) {
    auto m = sd15();
    const auto full = sd::plan_memory(m, request(512, 64e9), 0);
    sd::set_taesd_stage(m, 64, 9.8e6);
    const auto tiny = sd::plan_memory(m, request(512, 64e9), 0);
    EXPECT_TRUE(tiny.taesd);
    EXPECT_FALSE(full.taesd);
    EXPECT_DOUBLE_EQ(tiny.vae.weights, 9.8e6);
    // 64 channels at 512x512, a few tensors of them: tens to hundreds of MiB, far below the VAE's.
    EXPECT_GT(tiny.vae.activations, 64 * MiB);
    EXPECT_LT(tiny.vae.activations, full.vae.activations / 2);
    EXPECT_EQ(tiny.vae.scores, 0);
    EXPECT_NE(tiny.describe().find("TAESD"), std::string::npos);
    // Twice the side, four times the activations.
    const auto big = sd::plan_memory(m, request(1024, 64e9), 0);
    EXPECT_NEAR(big.vae.activations, 4 * tiny.vae.activations, 1);
}

// The full VAE's tiles do not apply: a tight budget tiles the VAE, never a TAESD.
TEST(PlannerTaesd, NeverTiles) {
    auto m = sd15();
    auto r = request(2048, 64e9);
    r.vae_tile = 32;
    EXPECT_EQ(sd::plan_memory(m, r, 0).vae_tile, 32);
    sd::set_taesd_stage(m, 64, 9.8e6);
    const auto p = sd::plan_memory(m, r, 0);
    EXPECT_EQ(p.vae_tile, 0);
    EXPECT_NE(p.describe().find("VAE: TAESD, whole image"), std::string::npos);
}
