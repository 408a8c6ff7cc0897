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

// A1111's composed prompts: image 0 of two parts (weights 1 and 0.5), image 1 of one (weight
// 2); the unconditional rows first, then each part's, and combine_denoised's sum.
TEST(GuidanceRows, ComposedPartsAddTheirWeightedDifferences) {
    RecordingUnet unet;
    sd::TextSchedule text;
    const at::Tensor cond = at::tensor({1.0f, 2.0f, 3.0f}), uncond = at::tensor({-1.0f, -2.0f});
    text.texts.push_back({cond, uncond, {}, {}});
    text.spans = {{0, 0}};
    text.parts = {{0, 1.0}, {0, 0.5}, {1, 2.0}};
    sd::Guidance g(std::ref(unet), text, {}, 7.5, 8);
    const at::Tensor x = at::tensor({0.25f, 0.5f}).view({2, 1, 1, 1}), t = at::tensor({5, 5});
    const at::Tensor out = g(x, t);
    EXPECT_EQ(unet.pass_rows, std::vector<int64_t>{5});
    EXPECT_EQ(g.rows(), 5);
    // rows: [u0, u1, c0 (image 0), c1 (image 0), c2 (image 1)]: x * 10 + context
    const float e_u0 = 2.5f - 1, e_u1 = 5 - 2, e_c0 = 2.5f + 1, e_c1 = 2.5f + 2, e_c2 = 5 + 3;
    const float want0 = e_u0 + (e_c0 - e_u0) * 7.5f + (e_c1 - e_u0) * 3.75f, want1 = e_u1 + (e_c2 - e_u1) * 15.0f;
    EXPECT_FLOAT_EQ(out[0].item<float>(), want0);
    EXPECT_FLOAT_EQ(out[1].item<float>(), want1);
}

}  // namespace
