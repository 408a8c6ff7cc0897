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

// SDXL's --original-size / --target-size (WxH) and --crop-coords (TOP,LEFT).
TEST(ValueRules, WholePairs) {
    auto size = sd::parse_whole_pair("--original-size", "1024x768", 'x', 1);
    EXPECT_EQ(size.first, 1024);
    EXPECT_EQ(size.second, 768);
    auto crop = sd::parse_whole_pair("--crop-coords", "0,12", ',', 0);
    EXPECT_EQ(crop.first, 0);
    EXPECT_EQ(crop.second, 12);
    for (const char* bad : {"0x0", "0x64", "64", "x64", "64x", "64x64x64", "-1x64", "a x b", "64 x 64", "", "9999999x1"})
        EXPECT_THROW(sd::parse_whole_pair("--original-size", bad, 'x', 1), sd::Error) << bad;
    for (const char* bad : {"1", "1,2,3", "a,b", ",", "-1,0", "1.5,2"})
        EXPECT_THROW(sd::parse_whole_pair("--crop-coords", bad, ',', 0), sd::Error) << bad;
    try {
        sd::parse_whole_pair("--crop-coords", "1", ',', 0);
        FAIL();
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("--crop-coords takes two whole numbers, TOP,LEFT"), std::string::npos) << e.what();
    }
}
