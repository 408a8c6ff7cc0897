// The bf16 1x1 convolution as one product per image (src/kernels/pointwise_bf16.h) and
// the operator that routes to it (sd::conv1x1, src/engine/operators.h), against a
// double-precision convolution of the same bf16 values and LibTorch's own bf16 one.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "bf16_conv_cases.h"
#include "engine/operators.h"
#include "kernels/linear_kernel.h"
#include "kernels/pointwise_bf16.h"

using sdtest::bf16_bits;
using sdtest::ConvCase;
using sdtest::relative_rms;

TEST(PointwiseBf16, MatchesTheConvolutionWithOneRounding) {
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions on this CPU";
    // Channel counts off the 16-lane vector and pixel counts off it, a bias or none, one
    // image and two; 1024 output channels at 96x96 take their pixels in two strided chunks.
    const ConvCase cases[] = {{1, 64, 64, 16, 16, true}, {2, 17, 77, 5, 7, false}, {2, 320, 320, 64, 64, true},
                          {1, 256, 128, 3, 1, true}, {1, 64, 1024, 96, 96, true}, {3, 40, 24, 9, 11, false}};
    for (const auto& c : cases) {
        SCOPED_TRACE(testing::Message() << c.n << "x" << c.ic << "->" << c.oc << " at " << c.h << "x" << c.w);
        EXPECT_EQ(sd::kernels::pointwise_bf16_available(), !sd::kernels::cpu_has_amx());
        if (!sd::kernels::pointwise_bf16_available()) continue;
        at::manual_seed(c.ic * 1000 + c.oc);
        const auto x = at::randn({c.n, c.ic, c.h, c.w}).to(at::kBFloat16);
        const auto w = (at::randn({c.oc, c.ic, 1, 1}) / std::sqrt(1.0 * c.ic)).to(at::kBFloat16);
        const auto b = c.bias ? at::randn({c.oc}).to(at::kBFloat16) : at::Tensor();
        const auto want = at::conv2d(x.to(at::kDouble), w.to(at::kDouble), b.defined() ? b.to(at::kDouble) : b);
        auto y = at::full({c.n, c.oc, c.h, c.w}, 7.0, x.options());  // every value must be written
        ASSERT_TRUE(sd::kernels::pointwise_bf16(bf16_bits(x), c.n, c.ic, c.h * c.w, bf16_bits(w), c.oc,
                                                b.defined() ? bf16_bits(b) : nullptr, bf16_bits(y)));
        // fp32 sums and the bias rounded to bf16 once, as LibTorch's convolution does:
        // within a little of its error, and no value more than a few bf16 steps off.
        const double direct = relative_rms(at::conv2d(x, w, b), want);
        EXPECT_LT(relative_rms(y, want), 1.2 * direct + 1e-6) << "direct " << direct;
        const double worst = ((y.to(at::kDouble) - want).abs() / (want.abs() + 0.05)).max().item<double>();
        EXPECT_LT(worst, 0.02);
        // The operator takes the same route and gives the same bits.
        EXPECT_TRUE(at::equal(sd::conv1x1(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt), y));
    }
}

// fp32 (and anything but bf16 on a CPU where the product runs) is LibTorch's own convolution, bit for bit.
TEST(PointwiseBf16, Fp32TakesLibTorchsConvolution) {
    at::manual_seed(3);
    const auto x = at::randn({2, 8, 5, 5});
    const auto w = at::randn({4, 8, 1, 1});
    const auto b = at::randn({4});
    EXPECT_TRUE(at::equal(sd::conv1x1(x, w, b), at::conv2d(x, w, b)));
    EXPECT_TRUE(at::equal(sd::conv1x1(x, w, c10::nullopt), at::conv2d(x, w)));
}

// The sums a thread keeps stay within what the memory plan counts for them
// (pointwise_bf16_scratch_bytes), from SD's widest 1x1 layers to 16384 channels.
TEST(PointwiseBf16, KeptSumsStayWithinThePlannedScratch) {
    const int64_t planned = sd::kernels::pointwise_bf16_scratch_bytes();
    EXPECT_EQ(planned > 0, sd::kernels::pointwise_bf16_available());
    if (!sd::kernels::pointwise_bf16_available()) return;
    for (int64_t oc : {1, 4, 128, 320, 512, 1280, 2560, 4096, 16384})
        for (int64_t hw : {1, 64, 4096, 65536, 512 * 512, 1024 * 1024}) {
            const int64_t cols = sd::kernels::pointwise_bf16_chunk_columns(oc, hw);
            EXPECT_GE(cols, 1) << oc << " channels, " << hw << " pixels";
            EXPECT_LE(cols, hw) << oc << " channels, " << hw << " pixels";
            EXPECT_LE(oc * cols * 4, planned) << oc << " channels, " << hw << " pixels";
        }
}
