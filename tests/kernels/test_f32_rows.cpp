// The fp32 row kernels (src/kernels/f32_rows.h) and sd::geglu on fp32 against
// LibTorch's GEGLU (chunk, gelu, multiply): every build this CPU runs (the AVX2
// and baseline ones too, as SD_ATTENTION_ISA=avx2 would pick), odd widths included.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "engine/operators.h"
#include "kernels/f32_rows.h"

namespace {

// The reference: (h + bias) split in halves, first * gelu(second), erf form.
at::Tensor reference_geglu(const at::Tensor& h, const at::Tensor& bias) {
    const auto parts = (bias.defined() ? h + bias : h).chunk(2, -1);
    return parts[0] * at::gelu(parts[1]);
}

// Largest difference relative to the reference's largest magnitude: the kernel's
// erf polynomial is within 1.5e-7 absolute, fp32 rounding adds a few ulp.
double worst_relative(const at::Tensor& got, const at::Tensor& want) {
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item<double>();
}

const std::vector<std::vector<int64_t>> kShapes{{2, 300, 2560}, {3, 7, 18}, {1, 1, 34}, {5, 2}, {4, 46}, {2, 3, 10240}};

TEST(F32Rows, EveryBuildMatchesLibTorchsGeglu) {
    int builds = 0;
    for (const char* isa : {"avx512", "avx2", "baseline"}) {
        const auto* k = sd::kernels::f32_row_kernels_named(isa);
        if (!k) continue;  // this CPU cannot run it
        ++builds;
        for (const auto& shape : kShapes) {
            at::manual_seed(shape.back());
            const auto h = at::randn(shape) * 3;
            const int64_t width = shape.back() / 2, rows = h.numel() / shape.back();
            for (const bool with_bias : {false, true}) {
                const auto bias = with_bias ? at::randn({shape.back()}) : at::Tensor();
                auto sizes = shape;
                sizes.back() = width;
                auto got = at::full(sizes, 7.0f);
                // Two calls over [0, 1) and [1, rows): the row ranges parallel tasks get.
                k->geglu(h.data_ptr<float>(), with_bias ? bias.data_ptr<float>() : nullptr, got.data_ptr<float>(),
                         width, 0, 1);
                k->geglu(h.data_ptr<float>(), with_bias ? bias.data_ptr<float>() : nullptr, got.data_ptr<float>(),
                         width, 1, rows);
                EXPECT_LT(worst_relative(got, reference_geglu(h, bias)), 1e-6)
                    << isa << ", last dimension " << shape.back() << (with_bias ? ", bias" : "");
            }
        }
    }
    EXPECT_GE(builds, 1);  // the baseline runs everywhere
}

TEST(F32Rows, GegluOperatorTakesTheKernelForFp32) {
    for (const auto& shape : kShapes) {
        at::manual_seed(shape.back() + 1);
        const auto h = at::randn(shape) * 2;
        const auto bias = at::randn({shape.back()});
        const auto got = sd::geglu(h, bias);
        ASSERT_EQ(got.scalar_type(), at::kFloat);
        const auto want = reference_geglu(h, bias);
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_LT(worst_relative(got, want), 1e-6) << "last dimension " << shape.back();
        EXPECT_LT(worst_relative(sd::geglu(h, c10::nullopt), reference_geglu(h, at::Tensor())), 1e-6);
    }
    // A strided view (a slice of a wider tensor) gives the same as its dense copy.
    const auto wide = at::randn({3, 5, 40});
    const auto view = wide.narrow(2, 4, 20);
    EXPECT_TRUE(at::equal(sd::geglu(view, c10::nullopt), sd::geglu(view.contiguous(), c10::nullopt)));
    // Large magnitudes: gelu(g) is g above ~6 and 0 below ~-6, without NaN or overflow.
    const auto big = at::tensor({1.0f, 2.0f, -30.0f, 30.0f}).view({1, 4});
    const auto out = sd::geglu(big, c10::nullopt);
    EXPECT_NEAR(out[0][0].item<float>(), 0.0f, 1e-6f);
    EXPECT_NEAR(out[0][1].item<float>(), 60.0f, 1e-4f);
}

TEST(F32Rows, NamesThatDoNotExistAreNull) {
    EXPECT_EQ(sd::kernels::f32_row_kernels_named("sse9"), nullptr);
    ASSERT_NE(sd::kernels::f32_row_kernels_named("baseline"), nullptr);
    EXPECT_NE(sd::kernels::f32_row_kernels().geglu, nullptr);
}

}  // namespace
