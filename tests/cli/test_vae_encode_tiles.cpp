// The VAE encoder in tiles (issue 33): where the plan tiles the decoder, the
// encoder runs on the same tiles of the latent grid. Not exact: each tile
// normalises over itself and the mid-block attends within its tile only. On
// this tiny random VAE, 2 x 2 tiles of 8 latent pixels put the means within
// 0.81 (largest) and 0.18 (mean) of the largest |mean| of the whole encode,
// as measured; the bounds below leave a margin over that and catch a tiling
// that misplaces or drops tiles. A full-size VAE has not been measured.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "engine/loaded_stages.h"
#include "engine/vae_codec.h"
#include "test_util.h"

TEST(VaeEncodeTiles, CloseToTheWholeEncode) {
    sd::PipelineOptions o;
    o.model_dir = sdtest::test_models() + "/tiny-st";
    o.threads = 1;
    const sd::ModelConfig config = sd::load_model_config(o.model_dir);
    const sd::ComputeChoice compute = sd::resolve_compute(o);
    sd::StageTimes times;
    sd::LoadedStages stages(o, config, compute, times);
    sd::VaeCodec vae(o, stages);
    // A smooth picture with an edge, 128x96 pixels (16x12 latents).
    const at::Tensor ys = at::linspace(-1, 1, 96).view({1, 1, 96, 1}), xs = at::linspace(-1, 1, 128).view({1, 1, 1, 128});
    const at::Tensor picture =
        at::cat({ys * xs, at::sin(3 * xs) * at::ones({1, 1, 96, 1}), ((xs > 0.3).to(at::kFloat) * 1.6 - 0.8) * at::ones({1, 1, 96, 1})}, 1)
            .contiguous();
    sd::MemoryPlan whole, tiled;
    tiled.vae_tile = 8;  // 2 x 2 tiles with an overlap of 2 latent pixels
    const at::Tensor a = vae.encode(picture, whole), b = vae.encode(picture, tiled);
    ASSERT_EQ(a.sizes(), b.sizes());
    EXPECT_EQ(a.size(2), 12);
    const int64_t c = config.latent_channels;
    const at::Tensor mean_a = a.slice(1, 0, c), mean_b = b.slice(1, 0, c);
    const double scale = mean_a.abs().max().item<double>();
    const double err = (mean_a - mean_b).abs().max().item<double>() / scale;
    const double mean_err = (mean_a - mean_b).abs().mean().item<double>() / scale;
    std::printf("tiled encode: max |diff| %.4g, mean %.4g of max |mean|\n", err, mean_err);
    EXPECT_GT(err, 0.0) << "the tiles were not used";
    EXPECT_LT(err, 1.0);
    EXPECT_LT(mean_err, 0.25);
    // A plan whose tile covers the picture encodes it whole, exactly.
    sd::MemoryPlan big;
    big.vae_tile = 16;
    EXPECT_TRUE(at::equal(vae.encode(picture, big), a));
}
