// A1111's latent masked-content modes (issue 33): the masked area of the init
// latents replaced by the start noise (latent-noise) or by zeros
// (latent-nothing), the kept area and every random draw unchanged; and
// through the CLI, the mode running and recorded.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "engine/picture_start.h"
#include "test_util.h"

TEST(LatentFill, NoiseAndNothingReplaceOnlyTheMaskedLatents) {
    sd::PictureStart p;
    p.image_moments = at::randn({1, 8, 4, 6}, at::make_generator<at::CPUGeneratorImpl>(1));
    p.mask_latent = at::zeros({1, 1, 4, 6});
    p.mask_latent.slice(3, 0, 2).fill_(1);  // the left third is repainted
    auto draw = [&](sd::PictureStart::LatentFill fill) {
        p.latent_fill = fill;
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
        return sd::draw_start(p, 2, 4, 4, 6, 0.18215, gen);
    };
    const auto base = draw(sd::PictureStart::LatentFill::None);
    const auto noise = draw(sd::PictureStart::LatentFill::Noise);
    const auto nothing = draw(sd::PictureStart::LatentFill::Nothing);
    for (const auto* s : {&noise, &nothing}) {
        EXPECT_TRUE(at::equal(s->noise, base.noise));  // the draws are the same
        EXPECT_TRUE(at::equal(s->init_latents.slice(3, 2), base.init_latents.slice(3, 2)));  // kept area
    }
    EXPECT_TRUE(at::equal(noise.init_latents.slice(3, 0, 2), base.noise.slice(3, 0, 2)));
    EXPECT_EQ(nothing.init_latents.slice(3, 0, 2).abs().max().item<float>(), 0.0f);
    EXPECT_FALSE(at::equal(base.init_latents.slice(3, 0, 2), noise.init_latents.slice(3, 0, 2)));
}

TEST(LatentFill, ThroughTheCli) {
    const auto cases = sdtest::shared_cases_with("inpaint", "mask.png");
    ASSERT_FALSE(cases.empty());
    const std::string dir = cases.front(), out = sdtest::temp_dir();
    auto run = [&](const std::string& mode, const std::string& sub) {
        return sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out + "/" + sub,
                            "--quiet", "--threads", "1", "--prompt", "a", "--steps", "4", "--sampler", "euler",
                            "--strength", "0.6", "--init-img", dir + "/init.png", "--mask", dir + "/mask.png",
                            "--masked-content", mode});
    };
    for (const char* mode : {"latent-noise", "latent-nothing"}) {
        const auto r = run(mode, mode);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(sdtest::read_text(out + "/" + mode + "/00000.png").find(std::string("Masked content: ") + mode),
                  std::string::npos);
    }
    ASSERT_EQ(run("original", "original").exit_code, 0);
    EXPECT_NE(sdtest::read_text(out + "/latent-noise/00000.png"), sdtest::read_text(out + "/original/00000.png"));
}
