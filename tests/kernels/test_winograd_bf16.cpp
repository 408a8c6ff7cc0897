// The bf16 Winograd F(2x2, 3x3) convolution (src/kernels/winograd_bf16.h) and the
// operator that routes to it (sd::conv3x3, src/engine/operators.h), against an fp32
// convolution of the same bf16 values and against LibTorch's own bf16 convolution.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "bf16_conv_cases.h"
#include "engine/operators.h"
#include "kernels/linear_kernel.h"
#include "kernels/winograd_bf16.h"

namespace {

using Case = sdtest::ConvCase;
using sdtest::relative_rms;
uint16_t* bits(const at::Tensor& t) { return sdtest::bf16_bits(t); }

// Restores the operator's switch however a test ends.
struct WinogradSwitch {
    ~WinogradSwitch() { sd::set_bf16_winograd(true); }
};

}  // namespace

TEST(WinogradBf16, MatchesTheConvolutionWithinTwiceBf16sOwnError) {
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions on this CPU";
    // Tile rows of 8, 9, 17 and 20 tiles (vector tails), channel counts off the
    // 16-lane vector, a bias or none, one image and two.
    const Case cases[] = {{1, 64, 64, 16, 16, true},   {2, 72, 100, 18, 34, false}, {1, 96, 80, 20, 40, true},
                          {2, 128, 64, 32, 32, true},  {1, 65, 67, 16, 18, true},   {3, 64, 130, 22, 16, false},
                          {1, 320, 320, 64, 64, true}};
    for (const auto& c : cases) {
        SCOPED_TRACE(testing::Message() << c.n << "x" << c.ic << "->" << c.oc << " at " << c.h << "x" << c.w);
        // Routed where the CPU has no AMX; the kernel itself runs on any with avx512_bf16.
        EXPECT_EQ(sd::kernels::winograd_bf16_runs(c.n, c.ic, c.oc, c.h, c.w), !sd::kernels::cpu_has_amx());
        at::manual_seed(c.ic * 1000 + c.oc);
        const auto x = at::randn({c.n, c.ic, c.h, c.w}).to(at::kBFloat16);
        const auto w = (at::randn({c.oc, c.ic, 3, 3}) / std::sqrt(9.0 * c.ic)).to(at::kBFloat16);
        const auto b = c.bias ? at::randn({c.oc}).to(at::kBFloat16) : at::Tensor();
        const auto want = at::conv2d(x.to(at::kDouble), w.to(at::kDouble), b.defined() ? b.to(at::kDouble) : b, 1, 1);
        auto y = at::full({c.n, c.oc, c.h, c.w}, 7.0, x.options());  // every value must be written
        ASSERT_TRUE(sd::kernels::winograd_bf16_conv3x3(bits(x), c.n, c.ic, c.h, c.w, bits(w), c.oc,
                                                       b.defined() ? bits(b) : nullptr, bits(y)));
        const double direct = relative_rms(at::conv2d(x, w, b, 1, 1), want);
        const double winograd = relative_rms(y, want);
        // The 16 products in bf16 add one rounding of the transformed input and weight:
        // measured 1.9-2.0x the direct convolution's error (which rounds the output alone).
        EXPECT_LT(winograd, 3.0 * direct) << "direct " << direct;
        EXPECT_LT(winograd, 6e-3);
        // Nowhere far off, edges included (a wrong padding or tail shows here first).
        const double worst = (y.to(at::kDouble) - want).abs().max().item<double>();
        EXPECT_LT(worst, 0.03 * want.abs().max().item<double>());
    }
}

TEST(WinogradBf16, RefusesWhatItDoesNotRun) {
    if (!sd::kernels::cpu_has_bf16() || sd::kernels::cpu_has_amx()) {  // AMX: the direct convolution
        EXPECT_FALSE(sd::kernels::winograd_bf16_runs(2, 320, 320, 64, 64));
        return;
    }
    EXPECT_TRUE(sd::kernels::winograd_bf16_runs(2, 320, 320, 64, 64));
    EXPECT_FALSE(sd::kernels::winograd_bf16_runs(2, 320, 320, 63, 64)) << "odd height";
    EXPECT_FALSE(sd::kernels::winograd_bf16_runs(2, 320, 320, 64, 33)) << "odd width";
    EXPECT_FALSE(sd::kernels::winograd_bf16_runs(2, 4, 320, 64, 64)) << "the latent's 4 channels";
    EXPECT_FALSE(sd::kernels::winograd_bf16_runs(2, 320, 4, 64, 64)) << "to 4 channels";
    EXPECT_FALSE(sd::kernels::winograd_bf16_runs(2, 1280, 1280, 8, 8)) << "8x8: too few tiles to pay";
}

TEST(WinogradBf16, OperatorRoutesBf16AloneAndFollowsTheSwitch) {
    WinogradSwitch restore;
    at::manual_seed(3);
    const auto x32 = at::randn({2, 64, 16, 16}), w32 = at::randn({96, 64, 3, 3}) * 0.05, b32 = at::randn({96});
    // fp32 is LibTorch's convolution, bit for bit.
    EXPECT_TRUE(at::equal(sd::conv3x3(x32, w32, b32), at::conv2d(x32, w32, b32, 1, 1)));
    // bf16 convolutions need bf16 instructions (LibTorch's too: oneDNN has none without them).
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions on this CPU";
    const auto x = x32.to(at::kBFloat16), w = w32.to(at::kBFloat16), b = b32.to(at::kBFloat16);
    const auto direct = at::conv2d(x, w, b, 1, 1);
    sd::set_bf16_winograd(false);  // --winograd off
    EXPECT_TRUE(at::equal(sd::conv3x3(x, w, b), direct));
    sd::set_bf16_winograd(true);
    const auto routed = sd::conv3x3(x, w, b);
    if (!sd::kernels::winograd_bf16_runs(2, 64, 96, 16, 16)) {  // AMX: the direct convolution
        EXPECT_TRUE(at::equal(routed, direct));
        return;
    }
    EXPECT_FALSE(at::equal(routed, direct)) << "the Winograd route did not run";
    EXPECT_LT(relative_rms(routed, direct), 1e-2);
    // A size it does not run (8x8): LibTorch's convolution again.
    const auto small = x.narrow(2, 0, 8).narrow(3, 0, 8).contiguous();
    EXPECT_TRUE(at::equal(sd::conv3x3(small, w, b), at::conv2d(small, w, b, 1, 1)));
}

TEST(WinogradBf16, ScratchIsBoundedByTheLayer) {
    // 1280 x 1280 x 9 values: the transformed weight (16 for 9, 2 bytes) and one chunk.
    const int64_t values = 1280LL * 1280 * 9;
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions on this CPU";
    EXPECT_GE(sd::kernels::winograd_bf16_scratch_bytes(values), values * 16 / 9 * 2);
    EXPECT_LE(sd::kernels::winograd_bf16_scratch_bytes(values), values * 16 / 9 * 2 + (64LL << 20));
}
