// The planner's VAE encoder stage (issue 33): a batch that starts from a
// picture (or the hires fix's lanczos pass) loads the encoder beside the
// resident stages; it is tiled with the decoder and counted in the peak.
#include <gtest/gtest.h>

#include "memory/planner.h"
#include "planner_models.h"

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double MiB = 1024.0 * 1024;

sd::MemoryModel with_encoder() {
    sd::MemoryModel m = sdtest::sd15_memory_model();
    m.vae_encoder_weights = 130 * MiB;  // SD 1.5's encoder, float32 (vae_encoder.pt and its weights)
    return m;
}

sd::MemoryRequest request(int size, bool encode, double budget) {
    sd::MemoryRequest r;
    r.height = r.width = size;
    r.budget = budget;
    r.encode = encode;
    return r;
}

}  // namespace

TEST(PlannerEncoder, CountedOnlyWhenABatchEncodes) {
    const auto m = with_encoder();
    const auto txt = sd::plan_memory(m, request(512, false, 32 * GiB), 170 * MiB);
    const auto img = sd::plan_memory(m, request(512, true, 32 * GiB), 170 * MiB);
    EXPECT_FALSE(txt.encode);
    EXPECT_EQ(txt.describe().find("vae encoder"), std::string::npos);
    ASSERT_TRUE(img.encode);
    EXPECT_NE(img.describe().find("vae encoder : weights 130 MiB"), std::string::npos) << img.describe();
    EXPECT_DOUBLE_EQ(img.enc.weights, 130 * MiB);
    // The encoder at 512² runs its finest level on 512x512 pixels: as large as the decoder's activations.
    EXPECT_DOUBLE_EQ(img.enc.activations, img.vae.activations);
    // Loaded beside every resident stage: the peak is at least all weights plus the encode.
    EXPECT_GE(img.peak(), img.resident_total() + img.enc.weights + img.enc.transient() - 1);
    EXPECT_GE(img.peak(), txt.peak());
    // A model exported without an encoder has no such stage to plan.
    auto old = m;
    old.vae_encoder_weights = 0;
    EXPECT_FALSE(sd::plan_memory(old, request(512, true, 32 * GiB), 170 * MiB).encode);
}

TEST(PlannerEncoder, TiledWhereTheDecoderIs) {
    const auto m = with_encoder();
    sd::MemoryRequest r = request(2048, true, 32 * GiB);
    r.vae_tile = 32;
    const auto p = sd::plan_memory(m, r, 170 * MiB);
    EXPECT_EQ(p.vae_tile, 32);
    EXPECT_DOUBLE_EQ(p.enc.activations, p.vae.activations);
    r.vae_tile = 0;
    EXPECT_GT(sd::plan_memory(m, r, 170 * MiB).enc.activations, 10 * p.enc.activations);
    // Sequential loading: the encoder alone beside the base.
    r.vae_tile = 32;
    r.sequential = true;
    const auto s = sd::plan_memory(m, r, 170 * MiB);
    EXPECT_GE(s.peak(), s.enc.total(s.base));
}

TEST(PlannerEncoder, TheEncodeRaisesThePeakWhereTheVaeDominates) {
    const auto m = with_encoder();
    // One configuration, predicted with and without the encode: whole-image VAE
    // at 1024², where the decoder's transient is the largest, so the encoder's
    // weights beside the resident stages show in the peak.
    sd::MemoryPlan choice;
    choice.unet_rows = 1;
    const auto txt = sd::predict(m, request(1024, false, 64 * GiB), 170 * MiB, choice);
    const auto img = sd::predict(m, request(1024, true, 64 * GiB), 170 * MiB, choice);
    ASSERT_GE(txt.vae.transient(), txt.unet.transient());
    EXPECT_NEAR(img.peak() - txt.peak(), img.enc.weights, 1 * MiB);
}
