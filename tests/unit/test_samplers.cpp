// The sampler list (sd/samplers.h): names, checks and step counts come from one table.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "sd/error.h"
#include "sampling/schedule.h"
#include "sd/samplers.h"

TEST(SamplerList, NamesAreUniqueAndTheFirstIsTheDefault) {
    std::set<std::string> names, a1111;
    for (const auto& s : sd::samplers()) {
        EXPECT_TRUE(names.insert(s.name).second) << s.name;
        EXPECT_TRUE(a1111.insert(s.a1111_name).second) << s.a1111_name;
        EXPECT_EQ(&sd::sampler_info(s.name), &s);
        EXPECT_NE(sd::sampler_choices().find(s.name), std::string::npos);
    }
    EXPECT_EQ(sd::default_sampler(), sd::samplers().front().name);
    EXPECT_EQ(sd::sampler_info("euler_a").a1111_name, "Euler a");
}

TEST(SamplerList, UnknownNamesAndSchedulesAreOneLineErrors) {
    try {
        sd::sampler_info("heun");
        FAIL();
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("choose " + sd::sampler_choices()), std::string::npos) << e.what();
    }
    EXPECT_THROW(sd::check_sampler_settings("euler", "exponential"), sd::Error);
    EXPECT_THROW(sd::check_sampler_settings("plms", "karras"), sd::Error);
    EXPECT_NO_THROW(sd::check_sampler_settings("dpmpp_2m", "karras"));
}

// The ETA counts what runs: CompVis timesteps round up (30 -> 31), k-samplers run exactly --steps.
TEST(SamplerList, StepCountsFollowTheFamily) {
    EXPECT_EQ(sd::sampler_step_count("plms", 30, 1000), 31);
    EXPECT_EQ(sd::sampler_step_count("ddim", 50, 1000), 50);
    EXPECT_EQ(sd::sampler_step_count("euler", 30, 1000), 30);
    EXPECT_EQ(sd::sampler_step_count("dpmpp_2m", 7, 1000), 7);
    EXPECT_THROW(sd::sampler_step_count("plms", 3, 1000), sd::Error);  // would need timestep 1000
}

// --schedule leading|trailing for PLMS and DDIM: exactly --steps distinct timesteps
// within 0..T-1 for every count the CompVis spacing refuses (3, 9, 27, 101, ...) or rounds up.
TEST(SamplerList, LeadingAndTrailingSpacingsTakeAnyStepCount) {
    EXPECT_EQ(sd::compvis_timesteps(10, 1000, "leading"), (std::vector<int>{1, 101, 201, 301, 401, 501, 601, 701, 801, 901}));
    EXPECT_EQ(sd::compvis_timesteps(3, 1000, "trailing"), (std::vector<int>{332, 666, 999}));
    EXPECT_EQ(sd::compvis_timesteps(3, 1000, "leading"), (std::vector<int>{1, 334, 667}));
    EXPECT_EQ(sd::compvis_timesteps(50, 1000, "default"), sd::compvis_timesteps(50, 1000));
    for (const char* spacing : {"leading", "trailing"}) {
        for (int steps = 1; steps <= 1000; ++steps) {
            const auto ts = sd::compvis_timesteps(steps, 1000, spacing);
            ASSERT_EQ(static_cast<int>(ts.size()), steps) << spacing << " " << steps;
            EXPECT_EQ(std::set<int>(ts.begin(), ts.end()).size(), ts.size()) << spacing << " " << steps;
            EXPECT_GE(ts.front(), 0);
            EXPECT_LE(ts.back(), 999);
            EXPECT_TRUE(std::is_sorted(ts.begin(), ts.end()));
        }
        EXPECT_EQ(sd::sampler_step_count("plms", spacing, 3, 1000), 3);
        EXPECT_EQ(sd::sampler_step_count("ddim", spacing, 30, 1000), 30);
        EXPECT_NO_THROW(sd::check_sampler_settings("ddim", spacing));
        EXPECT_THROW(sd::check_sampler_settings("euler", spacing), sd::Error);
    }
    EXPECT_THROW(sd::sampler_step_count("plms", "default", 3, 1000), sd::Error);
    EXPECT_THROW(sd::compvis_timesteps(10, 1000, "middle"), sd::Error);
}
