// The conditioning built from weighted, chunked prompts (with a stand-in text
// encoder), and the effect of weighting and long prompts on images through the CLI.
#include <gtest/gtest.h>

#include "engine/conditioning.h"
#include "conformance_util.h"
#include "sd/model_config.h"
#include "prompt_util.h"

using sdtest::clip;
using sdtest::words;

// ---- conditioning with a stand-in text encoder ----

namespace {

// A fake encoder: the embedding of position j of a row is (id + j, 2 id, 1) / 1000.
at::Tensor fake_encode(const at::Tensor& ids) {
    auto f = ids.to(at::kFloat);
    auto pos = at::arange(ids.size(1), at::kFloat).view({1, -1});
    return at::stack({f + pos, 2 * f, at::ones_like(f)}, -1) / 1000;
}

sd::ModelConfig tiny_config() {
    sd::ModelConfig c;
    c.context_length = 77;
    return c;
}

}  // namespace

TEST(Conditioning, WeightsScaleTokensAndKeepTheMean) {
    auto z = at::rand({77, 8}) + 0.5;
    std::vector<float> w(77, 1.0f);
    w[3] = 1.5f;
    auto out = sd::apply_weights(z, w);
    EXPECT_NEAR(out.mean().item<double>(), z.mean().item<double>(), 1e-6);
    // token 3 grew relative to the others by exactly its weight
    auto ratio = (out[3] / z[3]) / (out[4] / z[4]);
    EXPECT_NEAR(ratio.min().item<double>(), 1.5, 1e-5);
    EXPECT_NEAR(ratio.max().item<double>(), 1.5, 1e-5);
}

TEST(Conditioning, PlainPromptsAreTheEncoderOutputUnchanged) {
    c10::InferenceMode guard;
    const std::vector<std::string> prompts = {"a red fox", "a cat"};
    auto c = sd::encode_conditioning(fake_encode, clip(), tiny_config(), prompts, {"", ""}, {});
    std::vector<int64_t> ids;
    for (const auto& p : prompts) {
        auto row = clip().encode_padded(p);
        ids.insert(ids.end(), row.begin(), row.end());
    }
    EXPECT_TRUE(at::equal(c.cond, fake_encode(at::tensor(ids).view({2, 77}))));
    EXPECT_EQ(c.uncond.sizes(), c.cond.sizes());
}

TEST(Conditioning, ShorterSidePaddedWithTheEmptyPromptsWindow) {
    c10::InferenceMode guard;
    auto c = sd::encode_conditioning(fake_encode, clip(), tiny_config(), {words(100)}, {"blurry"}, {});
    ASSERT_EQ(c.cond.sizes(), (std::vector<int64_t>{1, 154, 3}));
    ASSERT_EQ(c.uncond.sizes(), c.cond.sizes());
    auto empty = fake_encode(at::tensor(clip().encode_padded("")).view({1, 77}))[0];
    auto blurry = fake_encode(at::tensor(clip().encode_padded("blurry")).view({1, 77}))[0];
    EXPECT_TRUE(at::equal(c.uncond[0].slice(0, 0, 77), blurry));
    EXPECT_TRUE(at::equal(c.uncond[0].slice(0, 77, 154), empty));
    // and the prompt's second window is its tokens 76..100
    auto second = fake_encode(at::tensor(clip().encode_padded(words(25, 75))).view({1, 77}))[0];
    EXPECT_TRUE(at::equal(c.cond[0].slice(0, 77, 154), second));
}

// ---- through the CLI on the tiny model: the acceptance checks of issue 5 ----

namespace {

at::Tensor latents_for(const std::string& prompt, const std::string& negative = "", const std::string& syntax = "a1111") {
    const std::string out = sdtest::temp_dir();
    std::vector<std::string> args = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out,
                                     "--quiet", "--threads", "1", "--seed", "11", "--H", "64", "--W", "64", "--steps", "8",
                                     "--sampler", "ddim", "--prompt", prompt, "--save-latents", out + "/l.npy",
                                     "--prompt-syntax", syntax};
    if (!negative.empty()) args.insert(args.end(), {"--negative-prompt", negative});
    auto r = sdtest::run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? sdtest::load_tensor(out + "/l.npy") : at::zeros({1});
}

}  // namespace

TEST(PromptEffects, TokensBeyond75ChangeTheImage) {
    ASSERT_EQ(clip().encode(words(150)).size(), 150u);
    auto first75 = latents_for(words(75)), all150 = latents_for(words(150));
    const double d = sdtest::max_abs_diff(all150, first75) / first75.abs().max().item<double>();
    std::cerr << "150 tokens vs their first 75: latents differ by " << d << " relative\n";
    EXPECT_GT(d, 1e-3);
}

TEST(PromptEffects, StrongerWeightMovesTheImageFurther) {
    auto plain = latents_for("a red fox in a forest");
    auto w11 = latents_for("a (red:1.1) fox in a forest");
    auto w15 = latents_for("a (red:1.5) fox in a forest");
    auto same = latents_for("a (red:1.0) fox in a forest");
    const double d11 = sdtest::max_abs_diff(w11, plain), d15 = sdtest::max_abs_diff(w15, plain);
    std::cerr << "(red:1.1) moves latents by " << d11 << ", (red:1.5) by " << d15 << "\n";
    EXPECT_GT(d11, 0);
    EXPECT_GT(d15, 2 * d11);
    EXPECT_TRUE(at::equal(same, plain)) << "weight 1 must be the plain prompt exactly";
}

// The negative prompt gets the same chunking; the shorter side is padded.
TEST(PromptEffects, LongNegativePromptWithShortPrompt) {
    auto none = latents_for("a red fox");
    auto neg75 = latents_for("a red fox", words(75));
    auto neg150 = latents_for("a red fox", words(150));
    EXPECT_GT(sdtest::max_abs_diff(neg75, none), 0);
    EXPECT_GT(sdtest::max_abs_diff(neg150, neg75), 0) << "the negative prompt's tokens beyond 75 count";
}

// --prompt-syntax plain is CompVis's conditioning: one window of the first 75
// tokens (the reference cuts there), which is what the default gives a prompt
// of 75 tokens, bit for bit; the default reads the rest as a second window.
TEST(PromptSyntax, PlainCutsALongPromptToItsFirstWindowAsCompVisDoes) {
    auto plain150 = latents_for(words(150), "", "plain");
    auto first75 = latents_for(words(75));
    EXPECT_TRUE(at::equal(plain150, first75)) << "differ by " << sdtest::max_abs_diff(plain150, first75);
}

// plain reads brackets as text: the same image as the default with the brackets escaped.
TEST(PromptSyntax, PlainReadsWeightSyntaxAsText) {
    auto plain = latents_for("a (red:1.5) fox in a forest", "", "plain");
    auto escaped = latents_for("a \\(red:1.5\\) fox in a forest");
    auto weighted = latents_for("a (red:1.5) fox in a forest");
    EXPECT_TRUE(at::equal(plain, escaped)) << "differ by " << sdtest::max_abs_diff(plain, escaped);
    EXPECT_GT(sdtest::max_abs_diff(plain, weighted), 0);
}
