// 8-bit weights (engine/q8_weights.h): GGUF q8_0 blocks as ggml quantizes them, and
// the rounding they keep.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/operators.h"
#include "engine/q8_weights.h"
#include "sd/error.h"

namespace {

// One block by the rule in ../shared/conformance/gguf/README.md's terms, value by value.
void expect_block(const float* x, const int8_t* q, at::Half d) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float scale = amax / 127.0f;
    EXPECT_EQ(static_cast<float>(d), static_cast<float>(at::Half(scale)));
    for (int j = 0; j < 32; ++j) {
        const float want = scale == 0 ? 0.0f : std::round(x[j] * (1.0f / scale));
        EXPECT_EQ(q[j], static_cast<int8_t>(want)) << j;
    }
}

}  // namespace

TEST(Q8Weights, BlocksFollowGgmlQ8_0) {
    at::manual_seed(3);
    const at::Tensor w = at::randn({6, 4, 2, 8}) * at::rand({6, 1, 1, 1}) * 4;  // rows of 64: two blocks
    w[2].zero_();                                                             // a zero block: scale 0
    auto [q, d] = sd::quantize_q8_0(w);
    ASSERT_EQ(q.sizes(), w.sizes());
    ASSERT_EQ(d.sizes(), (at::IntArrayRef{6, 2}));
    for (int64_t b = 0; b < w.numel() / 32; ++b)
        expect_block(w.data_ptr<float>() + b * 32, q.data_ptr<int8_t>() + b * 32, d.data_ptr<at::Half>()[b]);
    // Each block's largest value is +-127; the expansion is within half a step of the original, plus the
    // scale's fp16 rounding (q is computed with the fp32 scale, as ggml does): 127 * 2^-11 of a step.
    const at::Tensor expanded = (q.reshape({6, 2, 32}).to(at::kFloat) * d.to(at::kFloat).unsqueeze(2)).reshape(w.sizes());
    const at::Tensor step = d.to(at::kFloat).repeat_interleave(32, 1).reshape(w.sizes());
    EXPECT_TRUE(((expanded - w).abs() <= step * 0.57 + 1e-7).all().item<bool>());
    EXPECT_EQ(q.abs().amax().item<int8_t>(), 127);
}

TEST(Q8Weights, AQ8_0BlockRequantizesToItself) {
    // A GGUF q8_0 block expanded and narrowed again comes back unchanged (a q8_0 file
    // given as float32 loses nothing more under --weights q8).
    at::manual_seed(5);
    at::Tensor qs = at::randint(-127, 128, {4, 32}, at::TensorOptions().dtype(at::kChar));
    qs.index_put_({at::indexing::Slice(), 0}, 127);
    const at::Tensor scales = (at::rand({4, 1}) * 0.05 + 1e-4).to(at::kHalf);
    const at::Tensor x = qs.to(at::kFloat) * scales.to(at::kFloat);
    auto [q, d] = sd::quantize_q8_0(x);
    EXPECT_TRUE(at::equal(q, qs));
    EXPECT_TRUE(at::equal(d.reshape({4, 1}), scales));
}

// A block whose scale max|x| / 127 is not a normal float has no safe reciprocal (1 / 7.9e-41
// is inf, then 0 * inf NaN, and casting either to int8 is undefined): it is stored as zeros
// with d = 0, like a zero block. The smallest normal scale quantizes as any other block.
TEST(Q8Weights, BlocksTooSmallForAReciprocalAreZeros) {
    const float tiny = std::numeric_limits<float>::min();  // 1.18e-38
    const std::vector<float> maxima = {1e-36f, 1e-37f, 1e-38f, 1e-40f, std::numeric_limits<float>::denorm_min()};
    at::Tensor w = at::zeros({static_cast<int64_t>(maxima.size()) + 1, 32});
    for (size_t b = 0; b < maxima.size(); ++b) {
        w[b][3] = maxima[b];
        w[b][7] = -maxima[b] / 2;  // the rest 0
    }
    const int64_t normal = w.size(0) - 1;
    w[normal][0] = 127.0f * tiny;
    w[normal][1] = -63.5f * tiny;
    auto [q, d] = sd::quantize_q8_0(w);
    for (size_t b = 0; b < maxima.size(); ++b) {
        EXPECT_EQ(static_cast<float>(d[b][0].item<at::Half>()), 0.0f) << maxima[b];
        EXPECT_EQ(q[b].abs().sum().item<int64_t>(), 0) << maxima[b] << ": " << q[b];
    }
    EXPECT_EQ(q[normal][0].item<int8_t>(), 127);
    EXPECT_EQ(q[normal][1].item<int8_t>(), -64);  // -63.5 rounds away from zero
}

TEST(Q8Weights, NonFiniteWeightsAreRefused) {
    for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
        at::Tensor w = at::ones({2, 64});
        w[1][40] = bad;
        try {
            sd::quantize_q8_0(w);
            ADD_FAILURE() << bad << " was quantized";
        } catch (const sd::Error& e) {
            EXPECT_NE(std::string(e.what()).find("holds NaN or infinite values"), std::string::npos) << e.what();
        }
    }
}

// sd::expand_q8 (the exported layers' fp32 expansion) gives the bits of the
// TorchScript products it replaces, w.to(float) * scale.to(float) per block, for a
// convolution's 4-d weight, a slice of its output rows (conv_split), and odd block counts.
TEST(Q8Weights, ExpandEqualsTheTorchScriptProducts) {
    at::manual_seed(5);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{8, 4, 3, 8}, {5, 96}, {3, 32}}) {
        auto [q, d] = sd::quantize_q8_0(at::randn(shape) * 3);
        const auto expect = [](const at::Tensor& qq, const at::Tensor& dd) {
            return (qq.reshape({dd.size(0), dd.size(1), 32}).to(at::kFloat) * dd.to(at::kFloat).unsqueeze(2))
                .reshape(qq.sizes());
        };
        EXPECT_TRUE(at::equal(sd::expand_q8(q, d), expect(q, d)));
        EXPECT_TRUE(at::equal(sd::expand_q8(q.narrow(0, 1, 2), d.narrow(0, 1, 2)), expect(q.narrow(0, 1, 2), d.narrow(0, 1, 2))));
        EXPECT_FALSE(at::equal(sd::expand_q8(q, d), expect(q, d * 2)));  // the test sees a wrong scale
    }
    EXPECT_THROW(sd::expand_q8(at::zeros({2, 32}, at::kChar), at::zeros({2, 2}, at::kHalf)), c10::Error);
}
