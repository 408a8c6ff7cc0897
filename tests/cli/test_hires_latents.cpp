// The hires fix's latent upscalers (issue 33) through the library: a hires
// batch equals, byte for byte, the txt2img batch at the first size, its final
// latents upscaled by the same interpolation, and an img2img batch from those
// latents at the hires size (InitImage::latents) with the same seed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "engine/hires_pass.h"
#include "sd/pipeline.h"
#include "test_util.h"

namespace {

std::unique_ptr<sd::Pipeline> tiny_pipeline() {
    sd::PipelineOptions o;
    o.model_dir = sdtest::test_models() + "/tiny-st";
    o.threads = 1;
    return sd::make_pipeline(o);
}

struct HiresLatents : ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(HiresLatents, EqualsTxt2ImgUpscaleAndImg2ImgFromLatents) {
    const auto [upscaler, sampler] = GetParam();
    auto pipeline = tiny_pipeline();
    const std::vector<std::string> prompts = {"a red circle", "a blue square"};
    sd::GenerateSettings s;
    s.sampler = sampler;
    s.steps = 5;
    s.scale = 4;
    s.width = 48;
    s.height = 64;
    sd::GenerateSettings hires = s;
    hires.hires.scale = 1.5;  // 72 x 96, rounded down to the tiny model's multiple of 16: 64 x 96
    hires.hires.steps = 4;
    hires.hires.strength = 0.65;
    hires.hires.upscaler = upscaler;

    pipeline->seed(3);
    const sd::BatchOutput one = pipeline->generate(prompts, hires);
    ASSERT_EQ(one.images.size(), 2u);
    ASSERT_EQ(one.images[0].width, 64);
    ASSERT_EQ(one.images[0].height, 96);

    pipeline->seed(3);
    const sd::BatchOutput first = pipeline->generate(prompts, s);
    at::Tensor latents =
        at::from_blob(const_cast<float*>(first.latents.data()), first.latent_shape, at::kFloat).clone();
    latents = sd::upscale_latents(latents, 96 / 8, 64 / 8, upscaler).contiguous();
    sd::GenerateSettings second = s;
    second.width = 64;
    second.height = 96;
    second.steps = 4;
    second.init.strength = 0.65;
    second.init.latents.assign(latents.data_ptr<float>(), latents.data_ptr<float>() + latents.numel());
    second.init.latent_shape = latents.sizes().vec();
    pipeline->seed(3);
    const sd::BatchOutput two = pipeline->generate(prompts, second);

    EXPECT_TRUE(one.latents == two.latents) << "latents differ";
    for (size_t i = 0; i < one.images.size(); ++i)
        EXPECT_TRUE(one.images[i].rgb == two.images[i].rgb) << "image " << i << " differs";
    // The second pass did run: its result is not the upscaled first pass decoded.
    second.init.strength = 0.3;
    pipeline->seed(3);
    EXPECT_FALSE(pipeline->generate(prompts, second).latents == one.latents);
}

INSTANTIATE_TEST_SUITE_P(Upscalers, HiresLatents,
                         ::testing::Values(std::pair<std::string, std::string>{"latent", "ddim"},
                                           std::pair<std::string, std::string>{"latent", "euler_a"},
                                           std::pair<std::string, std::string>{"latent-nearest", "dpmpp_2m"}),
                         [](const auto& info) {
                             std::string n = info.param.first + "_" + info.param.second;
                             for (char& c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

// Upscaling the latents: bilinear (half-pixel centres, no antialiasing) and nearest on a known grid.
TEST(HiresLatents, UpscalersInterpolateAsTorch) {
    const at::Tensor x = at::arange(4, at::kFloat).view({1, 1, 2, 2});  // [[0, 1], [2, 3]]
    const at::Tensor nearest = sd::upscale_latents(x, 4, 4, "latent-nearest");
    EXPECT_EQ(nearest[0][0][1][1].item<float>(), 0.0f);
    EXPECT_EQ(nearest[0][0][2][3].item<float>(), 3.0f);
    const at::Tensor bilinear = sd::upscale_latents(x, 4, 4, "latent");
    EXPECT_FLOAT_EQ(bilinear[0][0][0][0].item<float>(), 0.0f);    // clamped at the edge
    EXPECT_FLOAT_EQ(bilinear[0][0][1][1].item<float>(), 0.75f);   // a quarter of the way along x (to 1) and y (to 2)
    EXPECT_FLOAT_EQ(bilinear[0][0][0][1].item<float>(), 0.25f);
}

// Progress through the library: (0, 0) as each pass starts sampling (its loading
// done), then each step; the hires fix runs two passes.
TEST(HiresLatents, ProgressMarksTheStartOfEachPass) {
    auto pipeline = tiny_pipeline();
    sd::GenerateSettings s;
    s.sampler = "ddim";
    s.steps = 4;
    s.width = s.height = 64;
    s.hires.scale = 1.5;
    s.hires.steps = 4;
    s.hires.strength = 0.5;
    std::vector<std::pair<int, int>> calls;
    pipeline->seed(1);
    pipeline->generate({"a red circle"}, s, [&](int step, int total) { calls.emplace_back(step, total); });
    const std::vector<std::pair<int, int>> want = {{0, 0}, {1, 4}, {2, 4}, {3, 4}, {4, 4}, {0, 0}, {1, 2}, {2, 2}};
    EXPECT_EQ(calls, want);
}

}  // namespace
