// Prompt weighting (A1111 syntax), long prompts in 75-token chunks, the
// conditioning built from them, and their effect on images through the CLI.
#include <gtest/gtest.h>

#include "engine/conditioning.h"
#include "conformance_util.h"
#include "sd/model_config.h"
#include "text/prompt_weights.h"
#include "test_util.h"
#include "sd/tokenizer.h"

using sd::WeightedText;

namespace {

struct Run {
    std::string text;
    double weight;
    bool is_break = false;
};

void expect_parse(const std::string& prompt, const std::vector<Run>& want) {
    auto got = sd::parse_prompt_weights(prompt);
    ASSERT_EQ(got.size(), want.size()) << "prompt: " << prompt;
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].text, want[i].text) << "prompt: " << prompt << " run " << i;
        EXPECT_DOUBLE_EQ(got[i].weight, want[i].weight) << "prompt: " << prompt << " run " << i;
        EXPECT_EQ(got[i].is_break, want[i].is_break) << "prompt: " << prompt << " run " << i;
    }
}

const Run kBreak{"", 1.0, true};

}  // namespace

// ---- the parser (AUTOMATIC1111's parse_prompt_attention semantics) ----

TEST(PromptWeights, PlainText) { expect_parse("normal text", {{"normal text", 1.0}}); }
TEST(PromptWeights, EmptyPrompt) { expect_parse("", {{"", 1.0}}); }
TEST(PromptWeights, RoundBracketsMultiplyBy1_1) {
    expect_parse("an (important) word", {{"an ", 1.0}, {"important", 1.1}, {" word", 1.0}});
}
TEST(PromptWeights, SquareBracketsDivideBy1_1) { expect_parse("a [faint] line", {{"a ", 1.0}, {"faint", 1 / 1.1}, {" line", 1.0}}); }
TEST(PromptWeights, ExplicitWeight) { expect_parse("(red:1.5) fox", {{"red", 1.5}, {" fox", 1.0}}); }
TEST(PromptWeights, ExplicitWeightWithSpaces) { expect_parse("(red: 0.25 )", {{"red", 0.25}}); }
TEST(PromptWeights, SignedWeight) { expect_parse("(red:-1)", {{"red", -1.0}}); }
TEST(PromptWeights, NestingMultiplies) {
    expect_parse("((word))", {{"word", 1.1 * 1.1}});
    expect_parse("[[word]]", {{"word", 1 / 1.1 / 1.1}});
    expect_parse("((word:1.5))", {{"word", 1.5 * 1.1}});
}
TEST(PromptWeights, MixedNestingCancels) { expect_parse("(a [b] c)", {{"a ", 1.1}, {"b", 1.0}, {" c", 1.1}}); }
TEST(PromptWeights, UnclosedBracketRunsToTheEnd) {
    expect_parse("(unbalanced", {{"unbalanced", 1.1}});
    expect_parse("a [b", {{"a ", 1.0}, {"b", 1 / 1.1}});
}
TEST(PromptWeights, ClosingBracketWithoutOpeningIsText) {
    expect_parse("a) b]", {{"a) b]", 1.0}});
}
TEST(PromptWeights, EscapedBrackets) { expect_parse("\\(literal\\]", {{"(literal]", 1.0}}); }
TEST(PromptWeights, EscapedBracketsInsideWeights) {
    expect_parse("(a \\(b\\):1.2)", {{"a (b)", 1.2}});
}
TEST(PromptWeights, EscapedBackslashAndLoneBackslash) {
    expect_parse("a\\\\b", {{"a\\b", 1.0}});
    expect_parse("a\\b", {{"ab", 1.0}});  // a lone backslash is dropped, as A1111 does
}
TEST(PromptWeights, AdjacentEqualWeightsMerge) { expect_parse("(unnecessary)(parens)", {{"unnecessaryparens", 1.1}}); }
TEST(PromptWeights, ColonIsTextUnlessAWeight) {
    expect_parse("photo: a cat", {{"photo: a cat", 1.0}});
    expect_parse("word:1.5)", {{"word:1.5)", 1.0}});  // no bracket open
    expect_parse("(word:abc)", {{"word:abc", 1.1}});
    expect_parse("(a:1.2", {{"a:1.2", 1.1}});  // no closing bracket: no weight
}
TEST(PromptWeights, MalformedNumberIsText) { expect_parse("(word:1.2.3)", {{"word:1.2.3)", 1.1}}); }
TEST(PromptWeights, TheA1111Example) {
    expect_parse("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
                 {{"a ", 1.0},
                  {"house", 1.3 * 1.1 * 1.1},
                  {" ", 1.1},
                  {"on", 1.0},
                  {" a ", 1.1},
                  {"hill", 0.55},
                  {", sun, ", 1.1},
                  {"sky", 1.1 * 1.1 * 1.1 * 1.1},
                  {".", 1.1}});
}
TEST(PromptWeights, BreakKeyword) {
    expect_parse("a cat BREAK a dog", {{"a cat", 1.0}, kBreak, {"a dog", 1.0}});
    expect_parse("BREAK", {{"", 1.0}, kBreak, {"", 1.0}});
    expect_parse("(a BREAK b)", {{"a", 1.1}, kBreak, {"b", 1.1}});
}
TEST(PromptWeights, BreakMustBeAWordInUpperCase) {
    expect_parse("BREAKfast break aBREAK", {{"BREAKfast break aBREAK", 1.0}});
}
TEST(PromptWeights, Utf8TextPassesThrough) {
    expect_parse("(café:1.2) naïve [señor]", {{"café", 1.2}, {" naïve ", 1.0}, {"señor", 1 / 1.1}});
}

// ---- chunking ----

namespace {

const sd::ClipTokenizer& clip() {
    static auto tok = sd::ClipTokenizer::load(sdtest::env("SD_SOURCE_DIR") + "/models/clip/vocab.json",
                                              sdtest::env("SD_SOURCE_DIR") + "/models/clip/merges.txt");
    return tok;
}

// n single-token words.
std::string words(int n, int offset = 0) {
    static const char* w[] = {"red", "blue", "green", "cat", "dog", "tree", "house", "river", "sky", "sun"};
    std::string s;
    for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + w[(i + offset) % 10];
    return s;
}

sd::PromptChunks chunks(const std::string& p, sd::PromptSyntax syntax = {}, int pad = 49407) {
    return sd::tokenize_prompt(clip(), p, syntax, 77, 49406, 49407, pad);
}

}  // namespace

TEST(PromptChunks, ShortPromptIsTheReferenceWindow) {
    for (const std::string& p : std::vector<std::string>{"", "a photograph of an astronaut riding a horse", "photo: a cat", words(75)}) {
        auto c = chunks(p);
        ASSERT_EQ(c.ids.size(), 1u) << p;
        EXPECT_EQ(c.ids[0], clip().encode_padded(p)) << p;
        EXPECT_FALSE(c.weighted()) << p;
    }
}

TEST(PromptChunks, SeventySixTokensMakeTwoWindows) {
    ASSERT_EQ(clip().encode(words(76)).size(), 76u);
    auto c = chunks(words(76));
    ASSERT_EQ(c.ids.size(), 2u);
    EXPECT_EQ(c.ids[0], clip().encode_padded(words(75)));
    EXPECT_EQ(c.ids[1], clip().encode_padded(words(1, 75)));
    EXPECT_EQ(chunks(words(150)).ids.size(), 2u);
    EXPECT_EQ(chunks(words(151)).ids.size(), 3u);
}

TEST(PromptChunks, LongPromptsOffTruncatesLikeTheReference) {
    auto c = chunks(words(150), {false, true});
    ASSERT_EQ(c.ids.size(), 1u);
    EXPECT_EQ(c.ids[0], clip().encode_padded(words(150)));
}

TEST(PromptChunks, WeightingOffKeepsBracketsAsText) {
    auto c = chunks("a (red:1.5) fox", {true, false});
    ASSERT_EQ(c.ids.size(), 1u);
    EXPECT_EQ(c.ids[0], clip().encode_padded("a (red:1.5) fox"));
    EXPECT_FALSE(c.weighted());
}

TEST(PromptChunks, WeightsFollowTheirTokens) {
    auto c = chunks("a (red:1.5) fox");
    ASSERT_EQ(c.ids.size(), 1u);
    EXPECT_EQ(c.ids[0], clip().encode_padded("a red fox"));
    std::vector<float> want(77, 1.0f);
    want[2] = 1.5f;  // [BOS] a red fox [EOS]
    EXPECT_EQ(c.weights[0], want);
}

TEST(PromptChunks, BreakStartsANewWindowPaddedWithThePadId) {
    auto c = chunks("a cat BREAK a dog", {}, 0);
    ASSERT_EQ(c.ids.size(), 2u);
    EXPECT_EQ(c.ids[0], clip().encode_padded("a cat", 77, 49406, 49407, 0));
    EXPECT_EQ(c.ids[1], clip().encode_padded("a dog", 77, 49406, 49407, 0));
}

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

at::Tensor latents_for(const std::string& prompt, const std::string& negative = "") {
    const std::string out = sdtest::temp_dir();
    std::vector<std::string> args = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out,
                                     "--quiet", "--threads", "1", "--seed", "11", "--H", "64", "--W", "64", "--steps", "8",
                                     "--sampler", "ddim", "--prompt", prompt, "--save-latents", out + "/l.npy"};
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
