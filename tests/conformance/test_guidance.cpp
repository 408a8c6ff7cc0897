// engine/guidance: the rows a guided step runs, their order and the formula.
#include "engine/guidance.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

// A stand-in UNet whose output tells which rows it saw: x * 10 + context.
struct RecordingUnet {
    std::vector<int64_t> pass_rows;
    at::Tensor operator()(const at::Tensor& x, const at::Tensor& t, const at::Tensor& context, const at::Tensor&) {
        pass_rows.push_back(x.size(0));
        EXPECT_EQ(t.size(0), x.size(0));
        return x * 10 + context.view({-1, 1, 1, 1});
    }
};

TEST(GuidanceRows, UncondRowsFirstThenCondCombinedByTheFormula) {
    RecordingUnet unet;
    const at::Tensor cond = at::tensor({1.0f, 2.0f}), uncond = at::tensor({-1.0f, -2.0f});
    sd::Guidance g(std::ref(unet), {cond, uncond, {}, {}}, 7.5, 4);
    const at::Tensor x = at::ones({2, 1, 1, 1}), t = at::tensor({5, 5});
    const at::Tensor out = g(x, t);
    // rows: [uncond0, uncond1, cond0, cond1]: e_u = 10 - {1, 2}, e_c = 10 + {1, 2}
    const at::Tensor e_u = 10 + uncond.view({-1, 1, 1, 1}), e_c = 10 + cond.view({-1, 1, 1, 1});
    EXPECT_TRUE(at::equal(out, e_u + 7.5 * (e_c - e_u)));
    EXPECT_TRUE(at::equal(out, sd::guide(e_u, e_c, 7.5)));
    EXPECT_EQ(unet.pass_rows, std::vector<int64_t>{4});
    EXPECT_EQ(g.evaluations(), 1);
    EXPECT_EQ(g.rows(), 4);
}

TEST(GuidanceRows, PassesOfAtMostRowsPerPassGiveTheSameOutput) {
    RecordingUnet whole, split;
    const at::Tensor cond = at::randn({3}), uncond = at::randn({3});
    const at::Tensor x = at::randn({3, 1, 1, 1}), t = at::tensor({1, 1, 1});
    const at::Tensor a = sd::Guidance(std::ref(whole), {cond, uncond, {}, {}}, 3.0, 6)(x, t);
    const at::Tensor b = sd::Guidance(std::ref(split), {cond, uncond, {}, {}}, 3.0, 4)(x, t);
    EXPECT_TRUE(at::equal(a, b));
    EXPECT_EQ(split.pass_rows, (std::vector<int64_t>{4, 2}));
}

TEST(GuidanceRows, ScaleOneRunsTheCondRowsOnly) {
    RecordingUnet unet;
    const at::Tensor cond = at::tensor({1.0f, 2.0f});
    sd::Guidance g(std::ref(unet), {cond, {}, {}, {}}, 1.0, 8);
    EXPECT_FALSE(g.guided());
    const at::Tensor out = g(at::zeros({2, 1, 1, 1}), at::tensor({0, 0}));
    EXPECT_TRUE(at::equal(out, cond.view({-1, 1, 1, 1})));
    EXPECT_EQ(g.rows(), 2);
}

}  // namespace
