// The bf16 row operators (sd::geglu, sd::layer_norm, sd::group_norm;
// src/engine/operators.h) against the same arithmetic in fp32 by LibTorch.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "engine/operators.h"

namespace {

// Largest difference in units of the reference's own bf16 rounding step
// (2^-8 of its magnitude, at least 2^-8 of `floor`): a one-pass kernel that
// computes in fp32 and rounds once lands within a step or two of it.
double worst_steps(const at::Tensor& got, const at::Tensor& want, double floor = 1e-2) {
    const auto step = (want.abs().clamp_min(floor) * (1.0 / 256)).to(at::kDouble);
    return ((got.to(at::kDouble) - want.to(at::kDouble)).abs() / step).max().item<double>();
}

TEST(Bf16Rows, GegluMatchesTheFp32Computation) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{{2, 300, 2560}, {3, 7, 18}, {1, 1, 34}, {5, 2}}) {
        at::manual_seed(shape.back());
        const auto h = (at::randn(shape) * 3).to(at::kBFloat16);
        const auto got = sd::geglu(h, c10::nullopt);
        ASSERT_EQ(got.scalar_type(), at::kBFloat16);
        const auto parts = h.to(at::kFloat).chunk(2, -1);
        const auto want = parts[0] * at::gelu(parts[1]);
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_LT(worst_steps(got, want), 2.0) << "last dimension " << shape.back();
        // With the projection's bias, added in fp32 before the gate.
        const auto bias = at::randn({shape.back()}).to(at::kBFloat16);
        const auto with = (h.to(at::kFloat) + bias.to(at::kFloat)).chunk(2, -1);
        EXPECT_LT(worst_steps(sd::geglu(h, bias), with[0] * at::gelu(with[1])), 2.0) << "bias, " << shape.back();
    }
}

TEST(Bf16Rows, LayerNormMatchesTheFp32Computation) {
    for (int64_t width : {320, 1280, 17, 3}) {
        at::manual_seed(width);
        const auto x = (at::randn({2, 65, width}) * 4 + 3).to(at::kBFloat16);
        const auto w = at::randn({width}).to(at::kBFloat16), b = at::randn({width}).to(at::kBFloat16);
        const auto got = sd::layer_norm_last(x, w, b, 1e-5);
        ASSERT_EQ(got.scalar_type(), at::kBFloat16);
        const auto want = at::layer_norm(x.to(at::kFloat), {width}, w.to(at::kFloat), b.to(at::kFloat), 1e-5);
        EXPECT_LT(worst_steps(got, want), 2.0) << "width " << width;
        const auto plain = sd::layer_norm_last(x, c10::nullopt, c10::nullopt, 1e-6);
        EXPECT_LT(worst_steps(plain, at::layer_norm(x.to(at::kFloat), {width}, {}, {}, 1e-6)), 2.0) << "width " << width;
    }
}

TEST(Bf16Rows, GroupNormMatchesTheFp32Computation) {
    struct Case {
        int64_t batch, channels, h, w, groups;
    };
    for (const Case& c : std::vector<Case>{{2, 320, 32, 32, 32}, {1, 6, 5, 3, 3}, {2, 128, 9, 7, 32}, {1, 4, 1, 1, 4}}) {
        at::manual_seed(c.channels + c.h);
        const auto x = (at::randn({c.batch, c.channels, c.h, c.w}) * 2 + 5).to(at::kBFloat16);
        const auto w = at::randn({c.channels}), b = at::randn({c.channels});
        const auto got = sd::group_norm(x, c.groups, w, b, 1e-5);
        ASSERT_EQ(got.scalar_type(), at::kBFloat16);
        const auto want = at::group_norm(x.to(at::kFloat), c.groups, w, b, 1e-5);
        EXPECT_LT(worst_steps(got, want), 2.0) << "channels " << c.channels << " groups " << c.groups;
    }
}

// fp32 GEGLU has its own one-pass kernel (test_f32_rows.cpp); the norms stay LibTorch's.
TEST(Bf16Rows, Fp32InputComputesAsLibTorch) {
    const auto x = at::randn({2, 8, 6, 6});
    EXPECT_TRUE(at::equal(sd::group_norm(x, 4, c10::nullopt, c10::nullopt, 1e-5), at::group_norm(x, 4)));
    EXPECT_TRUE(at::equal(sd::layer_norm_last(x, c10::nullopt, c10::nullopt, 1e-5), at::layer_norm(x, {6})));
}

TEST(Bf16Rows, BadShapesAreErrors) {
    const auto x = at::randn({2, 6, 4}).to(at::kBFloat16);
    EXPECT_THROW(sd::group_norm(x, 4, c10::nullopt, c10::nullopt, 1e-5), c10::Error);  // 6 % 4
    EXPECT_THROW(sd::geglu(at::randn({2, 5}).to(at::kBFloat16), c10::nullopt), c10::Error);  // odd width
    EXPECT_THROW(sd::geglu(at::randn({2, 6}).to(at::kBFloat16), at::randn({4})), c10::Error);  // bias size
    EXPECT_THROW(sd::layer_norm_last(x, at::randn({3}), c10::nullopt, 1e-5), c10::Error);
}

}  // namespace
