// --weights q8 in the memory planner (memory/planner.h): the UNet's 8-bit blocks
// (34 bytes a block of 32 values) and the fp32 expansion of the layer that runs
// are counted, and a budget never turns q8 on by itself.
#include <gtest/gtest.h>

#include "memory/planner.h"
#include "planner_models.h"

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double MiB = 1024.0 * 1024;

sd::MemoryRequest request(double budget, bool half, bool q8) {
    sd::MemoryRequest r;
    r.height = r.width = 512;
    r.budget = budget;
    r.half_weights = half;
    r.q8_weights = q8;
    r.prepack = false;
    return r;
}

}  // namespace

TEST(PlannerQ8, UnetWeightsAreBlocksOf32WithAScale) {
    const auto m = sdtest::sd15_memory_model();  // an fp32 file
    const auto p = sd::plan_memory(m, request(16 * GiB, false, true), 160 * MiB);
    EXPECT_NEAR(p.unet.weights / m.unet_weights, 34.0 / 32.0 / 4.0, 1e-9);
    const auto half = sd::plan_memory(m, request(16 * GiB, true, false), 160 * MiB);
    EXPECT_LT(p.peak(), half.peak());
    // Expanding an 8-bit layer costs more than widening an fp16 one: the int8 values widened and the product.
    EXPECT_GT(p.unet.activations, half.unet.activations);
    EXPECT_NE(p.compute.find("q8"), std::string::npos) << p.compute;
}

TEST(PlannerQ8, ABudgetNeverChoosesQ8) {
    const auto m = sdtest::sd15_memory_model();
    bool only_q8_fits = false;
    for (double budget = 8 * GiB; budget > 0.5 * GiB; budget -= 25 * MiB) {
        bool fp32_fits = true;
        try {
            const auto p = sd::plan_memory(m, request(budget, false, false), 160 * MiB);
            EXPECT_EQ(p.compute.find("q8"), std::string::npos) << budget / GiB << " GiB: " << p.compute;
            EXPECT_DOUBLE_EQ(p.unet.weights, m.unet_weights);
        } catch (const std::exception&) {
            fp32_fits = false;
        }
        bool q8_fits = true;
        try {
            sd::plan_memory(m, request(budget, false, true), 160 * MiB);
        } catch (const std::exception&) {
            q8_fits = false;
        }
        only_q8_fits = only_q8_fits || (q8_fits && !fp32_fits);
    }
    // There are budgets where only q8 would fit, and fp32 is refused there, not narrowed.
    EXPECT_TRUE(only_q8_fits);
}

// A --dtype q8_0 export: its UNet file holds the blocks, so q8 maps it as it is (nothing
// narrowed at load: the load is the weights), the same bytes as narrowing the fp32 file;
// fp32 or fp16 held expand it (four or two bytes a value).
TEST(PlannerQ8, EightBitFileIsCountedAsItIsHeld) {
    const auto fp32_file = sdtest::sd15_memory_model();
    auto q8_file = fp32_file;
    q8_file.q8_file = true;
    q8_file.unet_weights = fp32_file.unet_weights * 34.0 / 32.0 / 4.0;
    const auto narrowed = sd::plan_memory(fp32_file, request(16 * GiB, false, true), 160 * MiB);
    const auto mapped = sd::plan_memory(q8_file, request(16 * GiB, false, true), 160 * MiB);
    EXPECT_NEAR(mapped.unet.weights, narrowed.unet.weights, 1.0);
    EXPECT_DOUBLE_EQ(mapped.unet.load, mapped.unet.weights);
    EXPECT_LT(mapped.unet.load, narrowed.unet.load);
    const auto fp32 = sd::plan_memory(q8_file, request(16 * GiB, false, false), 160 * MiB);
    EXPECT_NEAR(fp32.unet.weights, fp32_file.unet_weights, 1.0);
    const auto fp16 = sd::plan_memory(q8_file, request(16 * GiB, true, false), 160 * MiB);
    EXPECT_NEAR(fp16.unet.weights, fp32_file.unet_weights / 2, 1.0);
}

// A q8 UNet is never prepacked (it expands its blocks per call), so --prepack is the VAE's
// alone: the UNet's activations stay as they are, the VAE's grow by the blocked layout's.
TEST(PlannerQ8, PrepackIsTheVaesAlone) {
    const auto m = sdtest::sd15_memory_model();
    for (const bool q8 : {true, false}) {
        auto plain = request(16 * GiB, false, q8), packed = plain;
        packed.prepack = true;
        const auto a = sd::plan_memory(m, plain, 160 * MiB), b = sd::plan_memory(m, packed, 160 * MiB);
        ASSERT_TRUE(b.prepack);
        EXPECT_GT(b.vae.activations, a.vae.activations) << "q8 " << q8;
        if (q8)
            EXPECT_DOUBLE_EQ(b.unet.activations, a.unet.activations);
        else
            EXPECT_GT(b.unet.activations, a.unet.activations);
    }
}
