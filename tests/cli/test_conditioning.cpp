// The conditioning built from weighted, chunked prompts (with a stand-in text
// encoder), and the effect of weighting and long prompts on images through the CLI.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "engine/conditioning.h"
#include "engine/text_schedule.h"
#include "sd/error.h"
#include "sd/sampler_catalog.h"
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

at::Tensor latents_for(const std::string& prompt, const std::string& negative = "", const std::string& syntax = "a1111",
                       const std::vector<std::string>& more = {}) {
    const std::string out = sdtest::temp_dir();
    std::vector<std::string> args = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out,
                                     "--quiet", "--threads", "1", "--seed", "11", "--H", "64", "--W", "64", "--steps", "8",
                                     "--sampler", "ddim", "--prompt", prompt, "--save-latents", out + "/l.npy",
                                     "--prompt-syntax", syntax};
    if (!negative.empty()) args.insert(args.end(), {"--negative-prompt", negative});
    args.insert(args.end(), more.begin(), more.end());  // later flags win
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

// ---- A1111's prompt editing and alternation (text/prompt_schedule.h, engine/text_schedule.h) ----

namespace {

// A stand-in encoder that numbers each text it is given and records its calls: cond and
// uncond hold, per image, the number of that image's text.
struct NumberingEncoder {
    std::map<std::string, float> numbers;
    std::vector<std::vector<std::string>> calls;
    at::Tensor rows(const std::vector<std::string>& texts) {
        std::vector<float> v;
        for (const auto& t : texts) v.push_back(numbers.emplace(t, static_cast<float>(numbers.size() + 1)).first->second);
        return at::tensor(v);
    }
    sd::UnetConditioning operator()(const std::vector<std::string>& p, const std::vector<std::string>& n) {
        calls.push_back(p);
        calls.back().insert(calls.back().end(), n.begin(), n.end());
        return {rows(p), n.empty() ? at::Tensor() : rows(n), {}, {}};
    }
};

std::vector<std::string> texts_of(const NumberingEncoder& e, const at::Tensor& rows) {
    std::vector<std::string> out;
    for (int64_t i = 0; i < rows.size(0); ++i)
        for (const auto& [text, number] : e.numbers)
            if (number == rows[i].item<float>()) out.push_back(text);
    return out;
}

}  // namespace

// Two images, one edited and one alternating, share the steps where either changes;
// each set of texts is encoded once, in this pass or a later one.
TEST(TextSchedule, ImagesScheduleTogetherAndEachTextSetIsEncodedOnce) {
    NumberingEncoder enc;
    sd::TextScheduler scheduler(std::ref(enc));
    const std::vector<std::string> prompts = {"a [x:y:2]", "b [u|v]"}, negatives = {"[n::3]", "[n::3]"};
    const sd::TextSchedule first = scheduler.pass(prompts, negatives, true, 4);
    using V = std::vector<std::string>;
    ASSERT_EQ(first.spans.size(), 4u);
    const std::vector<V> want = {{"a x", "b u", "n", "n"}, {"a x", "b v", "n", "n"}, {"a y", "b u", "n", "n"},
                                 {"a y", "b v", "", ""}};
    for (size_t k = 0; k < 4; ++k) {
        EXPECT_EQ(first.spans[k].last_call, static_cast<long long>(k + 1));
        const sd::UnetConditioning& c = first.texts[first.spans[k].text];
        V got = texts_of(enc, c.cond);
        const V neg = texts_of(enc, c.uncond);
        got.insert(got.end(), neg.begin(), neg.end());
        EXPECT_EQ(got, want[k]) << "span " << k;
    }
    EXPECT_EQ(enc.calls, want);
    // A hires fix's second pass of 2 steps after these 4: the edit is past (step 2 of 4), the
    // negative's too (3 - 4 < 1), the alternation starts again. Its second set was encoded
    // already; its first is new.
    const sd::TextSchedule second = scheduler.pass(prompts, negatives, true, 2, 4);
    ASSERT_EQ(second.spans.size(), 2u);
    EXPECT_EQ(texts_of(enc, second.texts[second.spans[0].text].cond), (V{"a y", "b u"}));
    EXPECT_EQ(texts_of(enc, second.texts[second.spans[0].text].uncond), (V{"", ""}));
    EXPECT_EQ(texts_of(enc, second.texts[second.spans[1].text].cond), (V{"a y", "b v"}));
    ASSERT_EQ(enc.calls.size(), 5u);
    EXPECT_EQ(enc.calls.back(), (V{"a y", "b u", "", ""}));
    // Without scheduling (--prompt-syntax plain) the texts are used as written, in one span.
    const sd::TextSchedule plain = scheduler.pass(prompts, negatives, false, 4);
    ASSERT_EQ(plain.spans.size(), 1u);
    EXPECT_EQ(enc.calls.back(), (V{"a [x:y:2]", "b [u|v]", "[n::3]", "[n::3]"}));
    // An alternation that comes back to a text reuses it: 2 texts for 6 spans.
    const sd::TextSchedule alt = scheduler.pass({"[p|q]"}, {}, true, 6);
    EXPECT_EQ(alt.spans.size(), 6u);
    EXPECT_EQ(alt.texts.size(), 2u);
}

// Sets of texts beyond the first take the room they are given; more are refused, in one
// line, before any of them is encoded.
TEST(TextSchedule, SetsThatDoNotFitTheirRoomAreRefusedBeforeEncoding) {
    NumberingEncoder enc;
    const double set = 2 * sizeof(float);  // one cond and one uncond value of one image
    sd::TextScheduler fits(std::ref(enc), 1.5 * set);
    EXPECT_EQ(fits.pass({"[a:b:2]"}, {"n"}, true, 4).texts.size(), 2u);
    sd::TextScheduler tight(std::ref(enc), 1.5 * set);
    enc.calls.clear();
    try {
        tight.pass({"[a|b|c]"}, {"n"}, true, 4);
        ADD_FAILURE() << "three sets in room for two";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("make 3 different sets of texts"), std::string::npos) << e.what();
    }
    EXPECT_EQ(enc.calls.size(), 1u);  // the first, which measures the others
}

// Each model call sees the text of the first span whose last call it has not passed
// (calls from 0, A1111's comparison); past the last span, the last text.
TEST(TextSchedule, GuidanceGivesEachCallItsSpansText) {
    sd::TextSchedule text;
    for (float v : {1.0f, 2.0f, 3.0f}) text.texts.push_back({at::tensor({v}), {}, {}, {}});
    text.spans = {{2, 0}, {3, 1}, {5, 2}, {6, 0}};
    std::vector<float> seen;
    auto unet = [&](const at::Tensor& x, const at::Tensor&, const at::Tensor& context, const at::Tensor&) {
        seen.push_back(context.item<float>());
        return x;
    };
    sd::Guidance g(unet, text, {}, 1.0, 4);
    for (int call = 0; call < 9; ++call) g(at::zeros({1, 1, 1, 1}), at::tensor({0}));
    EXPECT_EQ(seen, (std::vector<float>{1, 1, 1, 2, 3, 3, 1, 1, 1}));
}

// The web UI schedules over its model calls: twice the steps for the samplers it
// counts two a step for.
TEST(TextSchedule, SecondOrderSamplersScheduleOverTwiceTheSteps) {
    for (const auto& info : sd::samplers()) {
        const bool twice = info.name == "heun" || info.name == "dpm_2" || info.name == "dpm_2_a" ||
                           info.name == "dpmpp_2s_a" || info.name == "dpmpp_sde";
        EXPECT_EQ(sd::prompt_schedule_steps(info.name, 7), twice ? 14 : 7) << info.name;
    }
}

// Through the CLI: an edit whose WHEN is 0 is its TO at every step, one at the last step
// its FROM, bit for bit; one halfway, or an alternation, is neither.
TEST(PromptEditing, EditsAreTheirTextsAtTheirSteps) {
    const at::Tensor cat = latents_for("a cat in a forest"), dog = latents_for("a dog in a forest");
    EXPECT_TRUE(at::equal(latents_for("a [cat:dog:0] in a forest"), dog));
    EXPECT_TRUE(at::equal(latents_for("a [cat:dog:8] in a forest"), cat));
    EXPECT_TRUE(at::equal(latents_for("a [cat:dog:1.0] in a forest"), cat));
    const at::Tensor half = latents_for("a [cat:dog:0.5] in a forest"), alternating = latents_for("a [cat|dog] in a forest");
    for (const at::Tensor* t : {&half, &alternating}) {
        EXPECT_GT(sdtest::max_abs_diff(*t, cat), 0);
        EXPECT_GT(sdtest::max_abs_diff(*t, dog), 0);
    }
    EXPECT_GT(sdtest::max_abs_diff(half, alternating), 0);
    // The negative prompt too: removed from the first step is the empty negative.
    EXPECT_TRUE(at::equal(latents_for("a cat", "[blurry::0]"), latents_for("a cat")));
    EXPECT_TRUE(at::equal(latents_for("a cat", "[blurry::8]"), latents_for("a cat", "blurry")));
    // --prompt-syntax plain reads the brackets as words.
    EXPECT_FALSE(at::equal(latents_for("a [cat:dog:0] in a forest", "", "plain"), dog));
}

// Heun's 8 steps are scheduled as 16 calls: step 8 is halfway, not the end as for Euler.
TEST(PromptEditing, SecondOrderSamplersCountTwoCallsAStep) {
    const std::vector<std::string> euler = {"--sampler", "euler"}, heun = {"--sampler", "heun"};
    EXPECT_TRUE(at::equal(latents_for("a [cat:dog:8]", "", "a1111", euler), latents_for("a cat", "", "a1111", euler)));
    const at::Tensor edited = latents_for("a [cat:dog:8]", "", "a1111", heun);
    EXPECT_GT(sdtest::max_abs_diff(edited, latents_for("a cat", "", "a1111", heun)), 0);
    EXPECT_GT(sdtest::max_abs_diff(edited, latents_for("a dog", "", "a1111", heun)), 0);
    EXPECT_TRUE(at::equal(latents_for("a [cat:dog:16]", "", "a1111", heun), latents_for("a cat", "", "a1111", heun)));
}

// A hires fix's second pass: WHEN 1.0 is the end of the first pass (TO all through the
// second), 2.0 the end of the second (FROM throughout).
TEST(PromptEditing, TheHiresPassCountsOnFromTheFirst) {
    const std::vector<std::string> hires = {"--hires-scale", "1.5", "--hires-steps", "4", "--hires-strength", "0.6"};
    auto run = [&](const std::string& p) { return latents_for(p, "", "a1111", hires); };
    const at::Tensor cat = run("a cat"), dog = run("a dog"), switched = run("a [cat:dog:1.0]");
    EXPECT_TRUE(at::equal(run("a [cat:dog:2.0]"), cat));
    EXPECT_GT(sdtest::max_abs_diff(switched, cat), 0);
    EXPECT_GT(sdtest::max_abs_diff(switched, dog), 0);
    // Its first pass alone is the cat's (1.0: FROM up to the first pass's last step).
    EXPECT_TRUE(at::equal(latents_for("a [cat:dog:1.0]"), latents_for("a cat")));
}

// A weight that only an edited text holds is checked too: [ ] around it divide it by 1.1
// as weighting, but the edit removes them.
TEST(PromptEditing, AWeightBeyondFloatInAnEditedTextIsRefused) {
    const std::string out = sdtest::temp_dir();
    auto r = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out, "--quiet",
                          "--steps", "2", "--H", "64", "--W", "64", "--prompt",
                          "a [(cat:35" + std::string(37, '0') + "):dog:1]"});  // 3.5e38
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("--prompt: the weight of \"cat\" is not a finite number"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out + "/00000.png"));
}

// A1111's composed prompts through the CLI: a prompt's own weight is its share of the
// guidance, bit for bit; AND adds a part; at scale 1 the parts still combine.
TEST(ComposedPrompts, PartsCombineAsTheWebUiCombinesThem) {
    const at::Tensor cat = latents_for("a cat");
    EXPECT_TRUE(at::equal(latents_for("a cat:0.5"), latents_for("a cat", "", "a1111", {"--scale", "3.75"})));
    EXPECT_TRUE(at::equal(latents_for("a cat :1"), cat));
    const at::Tensor both = latents_for("a cat AND a dog"), zero = latents_for("a cat AND a dog:0");
    EXPECT_GT(sdtest::max_abs_diff(both, cat), 1e-3);
    // A part of weight 0 adds nothing (its rows run in a larger batch: rounding only).
    EXPECT_LT(sdtest::max_abs_diff(zero, cat), 1e-4 * cat.abs().max().item<double>());
    const std::vector<std::string> one = {"--scale", "1"};
    EXPECT_GT(sdtest::max_abs_diff(latents_for("a cat AND a dog", "", "a1111", one), latents_for("a cat", "", "a1111", one)),
              1e-3);
    // --prompt-syntax plain: AND and the number are words.
    EXPECT_FALSE(at::equal(latents_for("a cat:0.5", "", "plain"), latents_for("a cat:0.5")));
}
