// Prompt weighting (A1111 syntax) and long prompts in 75-token chunks; the
// conditioning built from them is tested in cli/test_conditioning.cpp.
#include <gtest/gtest.h>

#include "prompt_util.h"
#include "sd/error.h"
#include "text/prompt_weights.h"

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

using sdtest::clip;
using sdtest::words;

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


// A weight that overflows a float would only show after sampling, as NaN latents.
TEST(PromptWeights, WeightsThatAreNotFiniteFloatsAreRefused) {
    const std::string nines(400, '9');
    const std::string deep = std::string(3000, '(') + "cat";
    for (const std::string& p : std::vector<std::string>{"a (cat:" + nines + ") dog", deep, "(cat:" + nines.substr(0, 40) + ")", "[x:1](y:-" + nines.substr(0, 40) + ")"}) {
        SCOPED_TRACE(p.substr(0, 30));
        try {
            sd::check_prompt_weights(p, "--prompt");
            ADD_FAILURE() << "accepted";
        } catch (const sd::Error& e) {
            EXPECT_EQ(std::string(e.what()).rfind("--prompt: the weight of \"", 0), 0u) << e.what();
            EXPECT_NE(std::string(e.what()).find("not a finite number"), std::string::npos) << e.what();
        }
    }
    for (const std::string& p : std::vector<std::string>{"(cat:" + nines.substr(0, 38) + ") dog", std::string(300, '(') + "cat", "\\(cat:" + nines + "\\)", ""})
        EXPECT_NO_THROW(sd::check_prompt_weights(p, "--prompt")) << p.substr(0, 30);
}

// A1111's composable prompts: split at AND, the word alone (its \bAND\b), each part
// with the weight a trailing ":NUMBER" gives it (its re_weight: these are what its
// regular expressions give).
TEST(ComposedParts, SplitAtTheWordAndWeighedAtTheEnd) {
    using P = std::vector<std::pair<std::string, double>>;
    const auto parts = [](const std::string& p) {
        P out;
        for (const auto& part : sd::composed_parts(p)) out.emplace_back(part.text, part.weight);
        return out;
    };
    EXPECT_EQ(parts("a cat AND a dog"), (P{{"a cat", 1.0}, {" a dog", 1.0}}));
    EXPECT_EQ(parts("a cat :1.5 AND a dog: -.5 "), (P{{"a cat", 1.5}, {" a dog", -0.5}}));
    EXPECT_EQ(parts("a cat:0.5"), (P{{"a cat", 0.5}}));  // one part, its weight too
    EXPECT_EQ(parts("a cat:2."), (P{{"a cat", 2.0}}));
    EXPECT_EQ(parts("(cat:1.2)"), (P{{"(cat:1.2)", 1.0}}));  // a bracket after the number: no weight
    for (const char* no : {"a cat:1.2.3", "a cat:1e2", "a cat:- 1", "a cat:", "a cat:.", "12:30 pm"})
        EXPECT_EQ(parts(no), (P{{no, 1.0}})) << no;
    EXPECT_EQ(parts("ratio 16:9"), (P{{"ratio 16", 9.0}}));  // as A1111 reads it
    EXPECT_EQ(parts("AND"), (P{{"", 1.0}, {"", 1.0}}));
    EXPECT_EQ(parts("x,AND:1.2"), (P{{"x,", 1.0}, {"", 1.2}}));
    EXPECT_EQ(parts("a\tAND\nb  "), (P{{"a", 1.0}, {"\nb", 1.0}}));
    for (const char* one : {"a cat and a dog", "ANDROID", "BRANDS", "AND_x", "x_AND", "And", "\xc3\xa9" "AND"})
        EXPECT_EQ(parts(one).size(), 1u) << one;
}
