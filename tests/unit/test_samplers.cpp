// The sampler list (sd/samplers.h): names, checks and step counts come from one table.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "sd/error.h"
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
