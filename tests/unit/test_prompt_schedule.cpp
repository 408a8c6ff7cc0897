// text/prompt_schedule: A1111's prompt editing and alternation. The expected
// schedules are the web UI's: the examples its modules/prompt_parser.py documents
// for get_learned_conditioning_prompt_schedules (10 steps), and what that function
// returned for the others (run on lark 1.1.5 while this was written).
#include "text/prompt_schedule.h"

#include "sd/error.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace {

using Schedule = std::vector<std::pair<int, std::string>>;

Schedule schedule(const std::string& prompt, int steps, int first_pass_steps = 0) {
    Schedule out;
    for (const auto& e : sd::prompt_schedule(prompt, steps, first_pass_steps)) out.emplace_back(e.until, e.text);
    return out;
}

TEST(PromptSchedule, TheWebUisExamples) {
    EXPECT_EQ(schedule("test", 10), (Schedule{{10, "test"}}));
    EXPECT_EQ(schedule("a [b:3]", 10), (Schedule{{3, "a "}, {10, "a b"}}));
    EXPECT_EQ(schedule("a [b: 3]", 10), (Schedule{{3, "a "}, {10, "a b"}}));
    EXPECT_EQ(schedule("a [[[b]]:2]", 10), (Schedule{{2, "a "}, {10, "a [[b]]"}}));
    EXPECT_EQ(schedule("[(a:2):3]", 10), (Schedule{{3, ""}, {10, "(a:2)"}}));
    EXPECT_EQ(schedule("a [b : c : 1] d", 10), (Schedule{{1, "a b  d"}, {10, "a  c  d"}}));
    EXPECT_EQ(schedule("a[b:[c:d:2]:1]e", 10), (Schedule{{1, "abe"}, {2, "ace"}, {10, "ade"}}));
    EXPECT_EQ(schedule("a [unbalanced", 10), (Schedule{{10, "a [unbalanced"}}));
    EXPECT_EQ(schedule("a [b:.5] c", 10), (Schedule{{5, "a  c"}, {10, "a b c"}}));
    // The web UI documents {{5, "a  c"}, {10, "a {b|d{ c"}} for this one, marked "not handling
    // this right now"; its code leaves it as written (the '|' is no alternation's), as here.
    EXPECT_EQ(schedule("a [{b|d{:.5] c", 10), (Schedule{{10, "a [{b|d{:.5] c"}}));
    EXPECT_EQ(schedule("((a][:b:c [d:3]", 10), (Schedule{{3, "((a][:b:c "}, {10, "((a][:b:c d"}}));
    Schedule alternating;
    for (int s = 1; s <= 10; ++s) alternating.emplace_back(s, s % 2 ? "a" : "(b:1.1)");
    EXPECT_EQ(schedule("[a|(b:1.1)]", 10), alternating);
    Schedule female, fe3;
    for (int s = 1; s <= 10; ++s) {
        female.emplace_back(s, s % 2 ? "female" : "male");
        fe3.emplace_back(s, s % 4 == 1 ? "female" : "male");
    }
    EXPECT_EQ(schedule("[fe|]male", 10), female);
    EXPECT_EQ(schedule("[fe|||]male", 10), fe3);
    // A hires fix's second pass of 10 steps after a first pass of 10: fractions count from 1.
    EXPECT_EQ(schedule("a [b:.5] c", 10, 10), (Schedule{{10, "a b c"}}));
    EXPECT_EQ(schedule("a [b:1.5] c", 10, 10), (Schedule{{5, "a  c"}, {10, "a b c"}}));
}

TEST(PromptSchedule, WhenIsAFractionWithADecimalPointElseAStep) {
    // The fraction truncated toward zero, as Python's int(); at most the steps.
    EXPECT_EQ(schedule("[cat:dog:0.5]", 15), (Schedule{{7, "cat"}, {15, "dog"}}));
    EXPECT_EQ(schedule("[cat:dog:1.]", 8), (Schedule{{8, "cat"}}));  // 1. is all 8 steps
    EXPECT_EQ(schedule("[cat:dog:1]", 8), (Schedule{{1, "cat"}, {8, "dog"}}));
    EXPECT_EQ(schedule("[cat:dog:1e1]", 20), (Schedule{{10, "cat"}, {20, "dog"}}));  // no point: step 10
    EXPECT_EQ(schedule("[cat:dog:+3]", 20), (Schedule{{3, "cat"}, {20, "dog"}}));
    EXPECT_EQ(schedule("[cat:dog:99]", 20), (Schedule{{20, "cat"}}));
    // 0 and below never come: TO from the first step.
    EXPECT_EQ(schedule("[cat:dog:0]", 20), (Schedule{{20, "dog"}}));
    EXPECT_EQ(schedule("[cat:dog:-0.3]", 20), (Schedule{{20, "dog"}}));
    // Out of a double's range (the web UI stops with an OverflowError): after every
    // step, before every one, or (a tiny number) at none.
    EXPECT_EQ(schedule("[cat:dog:1e400]", 4), (Schedule{{4, "cat"}}));
    EXPECT_EQ(schedule("[cat:dog:-1e400]", 4), (Schedule{{4, "dog"}}));
    EXPECT_EQ(schedule("[cat:dog:1e-400]", 4), (Schedule{{4, "dog"}}));
    // Whitespace around WHEN, not inside FROM or TO's text.
    EXPECT_EQ(schedule("[ cat : dog :\t2 ]", 4), (Schedule{{2, " cat "}, {4, " dog "}}));
    // A hires fix's second pass: a step counts on from the first pass's steps.
    EXPECT_EQ(schedule("[cat:dog:25]", 10, 20), (Schedule{{5, "cat"}, {10, "dog"}}));
    EXPECT_EQ(schedule("[cat:dog:15]", 10, 20), (Schedule{{10, "dog"}}));
}

TEST(PromptSchedule, WhatIsNotEditingIsLeftAsWritten) {
    for (const char* same : {"(a:1.3) [b] \\[c:d:2\\] e", "[a:b]", "[a:b:]", "[a:b:1x]", "[a:b:1e]", "[a:b:.]",
                             "(a|b)", "[a:b:c:2]", "[x:(y:1.5)]", "", "a BREAK b", "<lora:x:0.5> [y]"})
        EXPECT_EQ(schedule(same, 6), (Schedule{{6, same}})) << same;
    // A '|' outside brackets, a trailing '\' or "\" and a newline fail the whole grammar: nothing is scheduled.
    for (const char* whole : {"a | b [cat:dog:2]", "[cat:dog:2] \\", "[cat:dog:2] \\\nx", "[a|b"})
        EXPECT_EQ(schedule(whole, 6), (Schedule{{6, whole}})) << whole;
    // Brackets around an edit stay, and the edit inside them is applied.
    EXPECT_EQ(schedule("([cat:dog:2]:1.2) [[x|y]]", 3),
              (Schedule{{1, "(cat:1.2) [x]"}, {2, "(cat:1.2) [y]"}, {3, "(dog:1.2) [x]"}}));
    // An unclosed bracket before an edit is text; the edit still applies.
    EXPECT_EQ(schedule("[a [b:c:1]", 2), (Schedule{{1, "[a b"}, {2, "[a c"}}));
}

TEST(PromptSchedule, DeepOrLongPromptsStayBounded) {
    // More than kMaxScheduleDepth brackets open at once, closed or not: left as written.
    const int n = sd::kMaxScheduleDepth;
    const std::string deep = std::string(n + 1, '[') + "cat:dog:2" + std::string(n + 1, ']');
    EXPECT_EQ(schedule(deep, 4), (Schedule{{4, deep}}));
    const std::string open = std::string(n + 1, '(') + "[cat:dog:2]";
    EXPECT_EQ(schedule(open, 4), (Schedule{{4, open}}));
    // At the limit, applied.
    const std::string limit = std::string(n - 1, '[') + "cat:dog:2" + std::string(n - 1, ']');
    EXPECT_EQ(schedule(limit, 4), (Schedule{{2, std::string(n - 2, '[') + "cat" + std::string(n - 2, ']')},
                                            {4, std::string(n - 2, '[') + "dog" + std::string(n - 2, ']')}}));
    // Texts that would take more than kMaxScheduleBytes are refused, in one line.
    const std::string wide = "[a|b] " + std::string(9000, 'x');
    EXPECT_EQ(sd::prompt_schedule(wide, 900).size(), 900u);  // 8.1 MB: the limit is 8 MiB
    try {
        sd::prompt_schedule(wide, 1000);
        ADD_FAILURE() << "1000 texts of 9006 bytes";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("make 1000 texts of up to 9006 bytes over 1000 steps"), std::string::npos)
            << e.what();
    }
    // A long prompt of many brackets, unclosed ones among them: each parsed once.
    std::string many;
    for (int i = 0; i < 20000; ++i) many += "(a) [b:c:1] [d) ";
    const Schedule m = schedule(many, 2);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].second.substr(0, 16), "(a) b [d) (a) b ");
    EXPECT_EQ(m[1].second.substr(0, 16), "(a) c [d) (a) c ");
}

}  // namespace
