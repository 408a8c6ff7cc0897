// Prompt sources (sd/prompts.h): text and JSONL files, line by line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "test_util.h"
#include "sd/prompts.h"
#include "sd/value_rules.h"

TEST(Prompts, PlainTextSkipsBlankAndCommentLinesAcceptsCrlfAndBom) {
    auto p = sd::parse_prompts("\xEF\xBB\xBF" "first\r\n\n  # note\nsecond  \n\t\nthird", "f.txt", false);
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[0].prompt, "first");
    EXPECT_EQ(p[1].prompt, "second  ");
    EXPECT_EQ(p[2].prompt, "third");
    EXPECT_EQ(p[1].line, 4);
    EXPECT_EQ(p[2].where(), "f.txt:6");
}

TEST(Prompts, JsonlOverridesAreRead) {
    auto p = sd::parse_prompts(
        "{\"prompt\": \"a\", \"negative_prompt\": \"blur\", \"seed\": 7, \"steps\": 20, \"scale\": 5, \"H\": 64, "
        "\"W\": 96, \"sampler\": \"ddim\", \"n_iter\": 2}\n\n{\"prompt\": \"b\"}\n",
        "p.jsonl", true);
    ASSERT_EQ(p.size(), 2u);
    const auto& o = p[0].overrides;
    EXPECT_EQ(*o.negative_prompt, "blur");
    EXPECT_EQ(*o.seed, 7u);
    EXPECT_EQ(*o.steps, 20);
    EXPECT_EQ(*o.scale, 5.0);
    EXPECT_EQ(*o.height, 64);
    EXPECT_EQ(*o.width, 96);
    EXPECT_EQ(*o.sampler, "ddim");
    EXPECT_EQ(*o.n_iter, 2);
    EXPECT_FALSE(p[1].overrides.steps);
    EXPECT_EQ(p[1].line, 3);
}

TEST(Prompts, Utf8Validation) {
    EXPECT_TRUE(sd::is_valid_utf8("café 猫 🐱"));
    EXPECT_FALSE(sd::is_valid_utf8("caf\xe9"));          // Latin-1
    EXPECT_FALSE(sd::is_valid_utf8("\xc0\xaf"));         // overlong '/'
    EXPECT_FALSE(sd::is_valid_utf8("\xed\xa0\x80"));     // surrogate
    EXPECT_FALSE(sd::is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
    EXPECT_FALSE(sd::is_valid_utf8("\xe2\x82"));         // truncated
}

// A JSONL line nested past 64 levels is refused while it is parsed: printing
// such a value in the "got ..." of an error once recursed once per level, and
// 100000 levels overflowed the stack (docs/reliability.md).
TEST(Prompts, DeeplyNestedJsonlLineIsRefusedInOneLine) {
    auto nested = [](int depth) {
        return "{\"prompt\": \"a\", \"seed\": " + std::string(depth, '[') + std::string(depth, ']') + "}\n";
    };
    try {
        sd::parse_prompts(nested(100000), "p.jsonl", true);
        FAIL() << "accepted";
    } catch (const sd::Error& e) {
        EXPECT_STREQ(e.what(), "p.jsonl:1: not valid JSON (nested more than 64 levels deep)");
    }
    // 63 arrays inside the line's object is 64 levels: parsed, then refused as a seed.
    try {
        sd::parse_prompts(nested(63), "p.jsonl", true);
        FAIL() << "accepted";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("\"seed\" must be a whole number"), std::string::npos) << e.what();
    }
}
