// The numeric rules shared by flags and JSONL lines (sd/value_rules.h).
#include <gtest/gtest.h>

#include <string>

#include "sd/error.h"
#include "sd/value_rules.h"

TEST(ValueRules, SeedsTakeTheWholeUnsigned64BitRangeExactly) {
    EXPECT_EQ(sd::parse_seed("--seed", "0"), 0u);
    EXPECT_EQ(sd::parse_seed("--seed", "18446744073709551615"), 18446744073709551615ull);
    EXPECT_EQ(sd::parse_seed("--seed", "9223372036854775808"), 9223372036854775808ull);
    for (const char* bad : {"", "-1", "18446744073709551616", "99999999999999999999", "1e3", "12 ", "+5", "0x10"})
        EXPECT_THROW(sd::parse_seed("--seed", bad), sd::Error) << bad;
}

TEST(ValueRules, ScaleMustBeFiniteAndInRange) {
    EXPECT_EQ(sd::check_scale("--scale", 7.5), 7.5);
    EXPECT_EQ(sd::check_scale("--scale", 0), 0);
    for (double bad : {-0.5, 100.5, 1.0 / 0.0, -1.0 / 0.0, 0.0 / 0.0}) EXPECT_THROW(sd::check_scale("--scale", bad), sd::Error);
    try {
        sd::check_scale("p.jsonl:3: \"scale\"", 1e300);
        FAIL();
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("p.jsonl:3: \"scale\" must be a number from 0 to 100"), std::string::npos) << e.what();
    }
}

TEST(ValueRules, WholeNumbersAndThreads) {
    EXPECT_EQ(sd::check_whole("--steps", 1, sd::kStepsRange), 1);
    EXPECT_THROW(sd::check_whole("--steps", 0, sd::kStepsRange), sd::Error);
    EXPECT_THROW(sd::check_whole("--steps", sd::kStepsRange.hi + 1, sd::kStepsRange), sd::Error);
    EXPECT_EQ(sd::check_threads(0), 0);
    EXPECT_EQ(sd::check_threads(sd::max_threads()), sd::max_threads());
    EXPECT_GE(sd::max_threads(), 16);
    EXPECT_THROW(sd::check_threads(sd::max_threads() + 1), sd::Error);
    EXPECT_THROW(sd::check_threads(-1), sd::Error);
}
