// The fused attention operator (src/engine/operators.cpp) against the
// plain computation (every head's whole score matrix, in double), for every
// kernel build this CPU runs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/script.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "engine/operators.h"
#include "kernels/attention_kernel.h"
#include "kernels/linear_kernel.h"

namespace {

// The kernel picked once per process: tests of the other builds run the op
// in a child process with SD_ATTENTION_ISA set (see IsaChild below).
std::string chosen() { return sd::kernels::attention_kernel().name; }

struct Case {
    int64_t batch, n, m, heads, d;
};

// softmax(q kT scale) v head by head, scores in double: the definition.
at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads, double scale) {
    const int64_t d = q.size(2) / heads;
    std::vector<at::Tensor> outs;
    for (int64_t h = 0; h < heads; ++h) {
        const auto qh = q.narrow(2, h * d, d).to(at::kDouble), kh = k.narrow(2, h * d, d).to(at::kDouble),
                   vh = v.narrow(2, h * d, d).to(at::kDouble);
        outs.push_back(at::bmm((at::bmm(qh, kh.transpose(1, 2)) * scale).softmax(-1), vh));
    }
    return at::cat(outs, 2).to(q.scalar_type());
}

double max_rel_error(const at::Tensor& got, const at::Tensor& want) {
    return ((got - want).abs() / (want.abs() + 1e-3)).max().item<double>();
}

void expect_close(const Case& c, double input_scale = 1.0) {
    at::manual_seed(c.batch * 1000 + c.n * 7 + c.m * 3 + c.heads * 11 + c.d);
    const auto q = at::randn({c.batch, c.n, c.heads * c.d}) * input_scale;
    const auto k = at::randn({c.batch, c.m, c.heads * c.d}) * input_scale;
    const auto v = at::randn({c.batch, c.m, c.heads * c.d});
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const auto got = sd::fused_attention(q, k, v, c.heads, scale);
    const auto want = plain_attention(q, k, v, c.heads, scale);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double abs_err = (got - want).abs().max().item<double>();
    // Larger inputs give larger scores, whose rounding the reference shares.
    EXPECT_LT(abs_err, 2e-5 * input_scale) << "kernel " << chosen() << " batch " << c.batch << " n " << c.n << " m " << c.m
                             << " heads " << c.heads << " d " << c.d << " (relative " << max_rel_error(got, want) << ")";
}

TEST(FusedAttention, SelfAttentionHeadWidths8To160) {
    for (int64_t d : {8, 16, 24, 40, 64, 80, 96, 128, 160})
        expect_close({2, 300, 300, d == 160 ? 2 : 4, d});
}

TEST(FusedAttention, CrossAttentionWith77Keys) {
    for (int64_t d : {8, 40, 64, 80, 160}) expect_close({2, 257, 77, 3, d});
}

TEST(FusedAttention, OddSizesAndBatches) {
    for (const Case& c : std::vector<Case>{{1, 1, 1, 1, 8},   {3, 5, 3, 2, 40},   {1, 63, 65, 1, 17},
                                           {2, 65, 31, 5, 9},  {4, 129, 513, 2, 40}, {1, 1000, 7, 1, 160},
                                           {1, 4, 1100, 8, 40}, {2, 70, 70, 1, 512}})
        expect_close(c);
}

// A query row's output is the same bits whatever rows run beside it: the kernels
// block rows in registers (how many depends on the build) but keep each row's sums
// in one order. Micro-batching and a hires pass rely on it; so does any change of
// the blocking, which may then be checked against the old outputs byte for byte.
TEST(FusedAttention, RowsDoNotDependOnTheirNeighbours) {
    for (int64_t d : {40, 64, 80}) {
        at::manual_seed(d);
        const auto q = at::randn({1, 70, 2 * d}), k = at::randn({1, 300, 2 * d}), v = at::randn({1, 300, 2 * d});
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const auto all = sd::fused_attention(q, k, v, 2, scale);
        for (const auto& [first, rows] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {64, 6}, {9, 1}}) {
            const auto part = sd::fused_attention(q.narrow(1, first, rows).contiguous(), k, v, 2, scale);
            EXPECT_TRUE(at::equal(part, all.narrow(1, first, rows)))
                << "kernel " << chosen() << " d " << d << " rows " << first << "+" << rows;
        }
    }
}

TEST(FusedAttention, LargeScoresStayFinite) {
    // Scores in the hundreds: the running maximum keeps every exponent <= 0.
    expect_close({1, 100, 600, 2, 40}, 8.0);
}

TEST(FusedAttention, StridedInputs) {
    // q, k, v as column slices of one projection output, as a fused qkv layer gives them.
    at::manual_seed(5);
    const auto qkv = at::randn({2, 90, 3 * 4 * 40});
    const auto q = qkv.narrow(2, 0, 160), k = qkv.narrow(2, 160, 160), v = qkv.narrow(2, 320, 160);
    ASSERT_FALSE(q.is_contiguous());
    const auto got = sd::fused_attention(q, k, v, 4, 0.158);
    const auto want = plain_attention(q, k, v, 4, 0.158);
    EXPECT_LT((got - want).abs().max().item<double>(), 2e-5);
}

TEST(FusedAttention, OtherDtypesTakeTheChunkedReference) {
    // 600 queries: three chunks of the reference's query rows.
    at::manual_seed(6);
    const auto q = at::randn({2, 600, 16}, at::kDouble), k = at::randn({2, 90, 16}, at::kDouble),
               v = at::randn({2, 90, 16}, at::kDouble);
    const auto got = sd::fused_attention(q, k, v, 2, 0.25);
    EXPECT_TRUE(at::equal(got, sd::reference_attention(q, k, v, 2, 0.25)));
    // scores in fp32 there, as in the modules' per-head path
    EXPECT_LT((got - plain_attention(q, k, v, 2, 0.25)).abs().max().item<double>(), 1e-5);
}

// bf16 inputs (--precision bf16) take the kernel where the CPU has bf16
// instructions, the reference elsewhere; either way the output is bf16 and
// within bf16's rounding of the exact result of the same bf16 inputs.
TEST(FusedAttention, BfloatInputsStayWithinTheirRounding) {
    // Where oneDNN has no bf16 (a CPU without it, or DNNL_MAX_CPU_ISA hiding it), bf16
    // attention takes LibTorch's reference, which then fails in LibTorch's own bf16 product.
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions here, as oneDNN sees them";
    for (const Case& c : std::vector<Case>{{2, 300, 300, 4, 40}, {2, 257, 77, 3, 80}, {1, 63, 65, 1, 17},
                                           {2, 1030, 1030, 2, 160}, {1, 5, 3, 2, 8}}) {
        at::manual_seed(c.n * 13 + c.d);
        const auto q = at::randn({c.batch, c.n, c.heads * c.d}).to(at::kBFloat16);
        const auto k = at::randn({c.batch, c.m, c.heads * c.d}).to(at::kBFloat16);
        const auto v = at::randn({c.batch, c.m, c.heads * c.d}).to(at::kBFloat16);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
        const auto got = sd::fused_attention(q, k, v, c.heads, scale);
        ASSERT_EQ(got.scalar_type(), at::kBFloat16);
        const auto want = plain_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), c.heads, scale);
        // |out| <= max |v| < 5; bf16 keeps 8 bits: 0.4% of each value, plus the
        // probabilities' own bf16 rounding where the products run in bf16.
        const double err = (got.to(at::kDouble) - want).abs().max().item<double>();
        EXPECT_LT(err, 0.03) << "n " << c.n << " m " << c.m << " d " << c.d;
        EXPECT_GT(err, 0.0) << "bf16 output identical to the double one: not rounded to bf16?";
        const double rel = ((got.to(at::kDouble) - want).norm() / want.norm()).item<double>();
        EXPECT_LT(rel, 0.01) << "n " << c.n << " m " << c.m << " d " << c.d;
    }
}

// The AMX build folds the scale into its exponent, which needs scale > 0;
// any other scale takes the general route of the same build.
TEST(FusedAttention, BfloatWithANegativeScale) {
    // Where oneDNN has no bf16 (a CPU without it, or DNNL_MAX_CPU_ISA hiding it), bf16
    // attention takes LibTorch's reference, which then fails in LibTorch's own bf16 product.
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions here, as oneDNN sees them";
    at::manual_seed(11);
    // Scores up to ~±100: the maximum in the wrong place would overflow the exponent.
    const auto q = (4 * at::randn({2, 70, 80})).to(at::kBFloat16), k = (4 * at::randn({2, 300, 80})).to(at::kBFloat16);
    const auto v = at::randn({2, 300, 80}).to(at::kBFloat16);
    const auto got = sd::fused_attention(q, k, v, 2, -0.3);
    const auto want = plain_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), 2, -0.3);
    EXPECT_LT((got.to(at::kDouble) - want).abs().max().item<double>(), 0.03);
}

// A scale above 1/log2(e) with padded keys (37 keys, padded to 64): the AMX build's
// padding scores times the scale must stay finite, or the row turns NaN.
TEST(FusedAttention, BfloatWithALargeScaleAndPaddedKeys) {
    // Where oneDNN has no bf16 (a CPU without it, or DNNL_MAX_CPU_ISA hiding it), bf16
    // attention takes LibTorch's reference, which then fails in LibTorch's own bf16 product.
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions here, as oneDNN sees them";
    at::manual_seed(12);
    const auto q = (0.3 * at::randn({1, 40, 64})).to(at::kBFloat16), k = (0.3 * at::randn({1, 37, 64})).to(at::kBFloat16);
    const auto v = at::randn({1, 37, 64}).to(at::kBFloat16);
    const auto got = sd::fused_attention(q, k, v, 2, 4.0);
    const auto want = plain_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), 2, 4.0);
    EXPECT_LT((got.to(at::kDouble) - want).abs().max().item<double>(), 0.03);
}

// Keys whose scores grow along the row: later key tiles score far above the
// first one's maximum (2^16 and more in probability), so the dot-product
// build's register-fed softmax must find a new maximum there rather than keep
// the old one as its reference. Also: a head whose scores barely move, where
// the reference is kept to the end.
TEST(FusedAttention, BfloatScoresThatGrowAlongTheKeys) {
    // Where oneDNN has no bf16 (a CPU without it, or DNNL_MAX_CPU_ISA hiding it), bf16
    // attention takes LibTorch's reference, which then fails in LibTorch's own bf16 product.
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "no bf16 instructions here, as oneDNN sees them";
    for (double growth : {0.0, 0.002, 0.02}) {
        at::manual_seed(13);
        const int64_t m = 1030;
        const auto ramp = (1.0 + growth * at::arange(m, at::kDouble)).to(at::kFloat).view({1, m, 1});
        const auto q = (2 * at::randn({2, 70, 80})).to(at::kBFloat16);
        const auto k = (2 * at::randn({2, m, 80}) * ramp).to(at::kBFloat16);
        const auto v = at::randn({2, m, 80}).to(at::kBFloat16);
        const auto got = sd::fused_attention(q, k, v, 2, 0.158);
        const auto want = plain_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), 2, 0.158);
        EXPECT_LT((got.to(at::kDouble) - want).abs().max().item<double>(), 0.03) << "growth " << growth;
    }
}

TEST(FusedAttention, BadShapesAreErrors) {
    const auto q = at::randn({1, 4, 16});
    EXPECT_THROW(sd::fused_attention(q, q, q, 3, 1.0), c10::Error);                        // 16 % 3
    EXPECT_THROW(sd::fused_attention(q, at::randn({2, 4, 16}), q, 2, 1.0), c10::Error);     // batch
    EXPECT_THROW(sd::fused_attention(q, q, at::randn({1, 5, 16}), 2, 1.0), c10::Error);     // keys
}

TEST(FusedAttention, RegisteredOperatorRunsTheKernel) {
    sd::register_operators();
    sd::register_operators();  // a second call is harmless
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow("sd::attention", "");
    at::manual_seed(7);
    const auto q = at::randn({2, 33, 80}), k = at::randn({2, 77, 80}), v = at::randn({2, 77, 80});
    const auto via_op = op.typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double)>()
                            .call(q, k, v, 2, 0.158);
    EXPECT_TRUE(at::equal(via_op, sd::fused_attention(q, k, v, 2, 0.158)));
}

// Every kernel build this CPU runs, each in its own process (the choice is
// made once per process from SD_ATTENTION_ISA).
TEST(FusedAttention, EveryInstructionSet) {
    if (std::getenv("SD_ATTENTION_ISA_CHILD")) GTEST_SKIP() << "inside a child run";
    int runs = 0;
    for (const char* isa : {"avx512", "avx2", "baseline", "amx", "avx512bf16"}) {
        if (!sd::kernels::attention_kernel_named(isa)) continue;
        const std::string cmd = std::string("SD_ATTENTION_ISA=") + isa + " SD_ATTENTION_ISA_CHILD=1 /proc/" +
                                std::to_string(getpid()) + "/exe --gtest_filter='FusedAttention.*-*EveryInstructionSet'" +
                                " > /dev/null";
        EXPECT_EQ(std::system(cmd.c_str()), 0) << "the " << isa << " kernel fails: run " << cmd;
        ++runs;
    }
    EXPECT_GE(runs, 1);
}

TEST(FusedAttention, ChildRunsTheKernelItWasGiven) {
    const char* want = std::getenv("SD_ATTENTION_ISA");
    if (!want) GTEST_SKIP() << "no SD_ATTENTION_ISA";
    EXPECT_EQ(chosen(), want);
}

}  // namespace
