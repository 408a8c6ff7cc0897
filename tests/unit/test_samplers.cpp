// The sampler list (sd/sampler_catalog.h): names, checks and step counts come from one table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <set>
#include <string>

#include "sd/error.h"
#include "core/a1111_schedules.h"
#include "core/schedule.h"
#include "sd/sampler_catalog.h"

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
        sd::sampler_info("heun9");
        FAIL();
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("choose " + sd::sampler_choices()), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("\"DPM++ 2M SDE Heun\""), std::string::npos) << e.what();
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
    try {
        sd::check_sampler_settings("euler", "Karass");
        FAIL();
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("align_your_steps"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("\"Align Your Steps\""), std::string::npos) << e.what();
    }
    EXPECT_THROW(sd::check_sampler_settings("euler", "exponentail"), sd::Error);
    EXPECT_THROW(sd::check_sampler_settings("heun", "trailing"), sd::Error);  // diffusers' schedulers: Euler only
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
        if (std::string(spacing) == "trailing") EXPECT_THROW(sd::check_sampler_settings("dpmpp_2m", spacing), sd::Error);
        else EXPECT_NO_THROW(sd::check_sampler_settings("dpmpp_2m", spacing));
        EXPECT_THROW(sd::check_sampler_settings("lcm", spacing), sd::Error);
    }
    EXPECT_NO_THROW(sd::check_sampler_settings("euler", "leading"));  // diffusers' Euler schedulers (issue 33)
    EXPECT_THROW(sd::check_sampler_settings("dpmpp_2m", "trailing"), sd::Error);
    EXPECT_THROW(sd::sampler_step_count("plms", "default", 3, 1000), sd::Error);
    EXPECT_THROW(sd::compvis_timesteps(10, 1000, "middle"), sd::Error);
}

// diffusers' "trailing" (the Turbo recipe's timesteps), numpy's rounding included.
TEST(SamplerList, TrailingTimestepsAreDiffusers) {
    EXPECT_EQ(sd::trailing_timesteps(1, 1000), (std::vector<int>{999}));
    EXPECT_EQ(sd::trailing_timesteps(2, 1000), (std::vector<int>{999, 499}));
    EXPECT_EQ(sd::trailing_timesteps(4, 1000), (std::vector<int>{999, 749, 499, 249}));
    // 1000 - 3 * 62.5 = 812.5: np.round rounds the half to even (812), not up.
    const auto ts16 = sd::trailing_timesteps(16, 1000);
    EXPECT_EQ(ts16[3], 811);
    EXPECT_EQ(ts16[1], 937);  // 937.5 -> 938 (even), then - 1
    auto ascending = ts16;
    std::reverse(ascending.begin(), ascending.end());
    EXPECT_EQ(sd::compvis_timesteps(16, 1000, "trailing"), ascending);  // PLMS/DDIM use the same list
    for (const char* sampler : {"euler", "euler_a"}) {
        EXPECT_NO_THROW(sd::check_sampler_settings(sampler, "trailing"));
        EXPECT_EQ(sd::sampler_step_count(sampler, "trailing", 1, 1000), 1);
    }
}

// diffusers' LCMScheduler: timesteps of the 50-step origin grid (not DDIM's 1000 / S spacing).
TEST(SamplerList, LcmTimestepsComeFromTheOriginGrid) {
    EXPECT_EQ(sd::lcm_timesteps(4, 1000), (std::vector<int>{999, 759, 499, 259}));
    EXPECT_EQ(sd::lcm_timesteps(3, 1000), (std::vector<int>{999, 679, 339}));
    EXPECT_EQ(sd::lcm_timesteps(2, 1000), (std::vector<int>{999, 499}));
    EXPECT_EQ(sd::lcm_timesteps(1, 1000), (std::vector<int>{999}));
    // All 50: the whole grid, 999 down to 19.
    const auto all = sd::lcm_timesteps(50, 1000);
    ASSERT_EQ(all.size(), 50u);
    EXPECT_EQ(all.front(), 999);
    EXPECT_EQ(all.back(), 19);
    for (int steps = 1; steps <= sd::kLcmOriginSteps; ++steps) {
        const auto ts = sd::lcm_timesteps(steps, 1000);
        EXPECT_EQ(std::set<int>(ts.begin(), ts.end()).size(), ts.size()) << steps;
        EXPECT_TRUE(std::is_sorted(ts.rbegin(), ts.rend())) << steps;
        EXPECT_EQ(sd::sampler_step_count("lcm", steps, 1000), steps);
    }
    // The must-fail variation of tests/fixtures/lcm: DDIM-like 1000 / S spacing is another list.
    EXPECT_NE(sd::lcm_timesteps(4, 1000), sd::trailing_timesteps(4, 1000));
    for (int bad : {0, 51, 1000}) {
        EXPECT_THROW(sd::lcm_timesteps(bad, 1000), sd::Error) << bad;
        EXPECT_THROW(sd::check_sampler_settings("lcm", "default", bad), sd::Error) << bad;
    }
    EXPECT_NO_THROW(sd::check_sampler_settings("lcm", "default", 50));
    EXPECT_NO_THROW(sd::check_sampler_settings("euler", "default", 51));  // only LCM has the 50-step limit
    EXPECT_THROW(sd::check_sampler_settings("lcm", "karras"), sd::Error);
    EXPECT_EQ(sd::sampler_info("lcm").a1111_name, "LCM");
}

// sgm's LegacyDDPMDiscretization timesteps (SDXL; tests/fixtures/sdxl-tiny/README.md).
TEST(SamplerSteps, SgmTimesteps) {
    EXPECT_EQ(sd::sgm_timesteps(10, 1000), (std::vector<int>{999, 899, 799, 699, 599, 499, 399, 299, 199, 99}));
    EXPECT_EQ(sd::sgm_timesteps(1, 1000), (std::vector<int>{999}));
    const auto ts12 = sd::sgm_timesteps(12, 1000);
    EXPECT_EQ(std::vector<int>(ts12.begin(), ts12.begin() + 3), (std::vector<int>{999, 915, 832}));
    EXPECT_EQ(ts12.back(), 83);
    const auto all = sd::sgm_timesteps(1000, 1000);
    EXPECT_EQ(all.front(), 999);
    EXPECT_EQ(all.back(), 0);
    EXPECT_THROW(sd::sgm_timesteps(0, 1000), sd::Error);
    EXPECT_THROW(sd::sgm_timesteps(1001, 1000), sd::Error);
    // Not diffusers' "trailing" (12 steps: 999, 916, ...).
    EXPECT_NE(sd::sgm_timesteps(12, 1000), sd::trailing_timesteps(12, 1000));
}

// img2img's step arithmetic (issue 33), as shared/conformance/img2img states it.
TEST(SamplerList, Img2ImgSteps) {
    // (CompVis's t_enc: tests/unit/test_img2img_schedule.cpp.)
    EXPECT_EQ(sd::diffusers_t_start(0.75, 10), 3);
    EXPECT_EQ(sd::diffusers_t_start(0.3, 15), 11);
    EXPECT_EQ(sd::diffusers_t_start(1.0, 10), 0);
    EXPECT_EQ(sd::diffusers_t_start(0.05, 10), 10);  // none runs
    EXPECT_EQ(sd::dpm_leading_timesteps(10, 1000), (std::vector<int>{901, 811, 721, 631, 541, 451, 361, 271, 181, 91}));
    EXPECT_THROW(sd::dpm_leading_timesteps(1000, 1000), sd::Error);
    // The public cases' steps run.
    EXPECT_EQ(sd::img2img_step_count("ddim", "default", 10, 0.75, 1000), 7);
    EXPECT_EQ(sd::img2img_step_count("ddim", "default", 20, 0.5, 1000), 10);
    EXPECT_EQ(sd::img2img_step_count("ddim", "leading", 10, 0.75, 1000), 7);
    EXPECT_EQ(sd::img2img_step_count("euler_a", "leading", 20, 0.5, 1000), 10);
    EXPECT_EQ(sd::img2img_step_count("dpmpp_2m", "karras", 15, 0.3, 1000), 4);
    EXPECT_EQ(sd::img2img_step_count("lcm", "default", 4, 0.5, 1000), 2);
    // CompVis at strength 1.0: all steps (img2img.py fails there; see sampling_loop.h),
    // and with 15 steps (16 DDIM entries) img2img.py's own 15.
    EXPECT_EQ(sd::img2img_step_count("ddim", "default", 10, 1.0, 1000), 10);
    EXPECT_EQ(sd::img2img_step_count("ddim", "default", 15, 1.0, 1000), 15);
    EXPECT_EQ(sd::img2img_step_count("ddim", "default", 10, 0.05, 1000), 0);
    EXPECT_THROW(sd::img2img_step_count("plms", "default", 10, 0.5, 1000), sd::Error);
    EXPECT_THROW(sd::img2img_step_count("ddim", "default", 10, 0.0, 1000), sd::Error);
    EXPECT_THROW(sd::img2img_step_count("ddim", "default", 10, 1.01, 1000), sd::Error);
    EXPECT_THROW(sd::img2img_step_count("ddim", "default", 3, 0.5, 1000), sd::Error);  // CompVis refuses 3 steps
}

// The web UI's names (issue 35): its sampler names as its PNGs write them, its
// "k_" aliases and 1.6-1.8 combined names, and its schedule labels.
TEST(SamplerNames, WebUiNamesMapToOurs) {
    const std::vector<std::pair<std::string, std::string>> samplers = {
        {"Euler a", "euler_a"},          {"Euler", "euler"},
        {"LMS", "lms"},                  {"Heun", "heun"},
        {"DPM2", "dpm_2"},               {"DPM2 a", "dpm_2_a"},
        {"DPM++ 2S a", "dpmpp_2s_a"},    {"DPM++ 2M", "dpmpp_2m"},
        {"DPM++ SDE", "dpmpp_sde"},      {"DPM++ 2M SDE", "dpmpp_2m_sde"},
        {"DPM++ 2M SDE Heun", "dpmpp_2m_sde_heun"}, {"DPM++ 3M SDE", "dpmpp_3m_sde"},
        {"DDIM", "ddim"},                {"PLMS", "plms"},
        {"LCM", "lcm"},                  {"k_dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun"},
        {"dpmpp_3m_sde", "dpmpp_3m_sde"}};
    for (const auto& [web, ours] : samplers) {
        const auto named = sd::parse_sampler_name(web);
        EXPECT_EQ(named.sampler, ours) << web;
        EXPECT_EQ(named.schedule, "") << web;
    }
    const std::vector<std::tuple<std::string, std::string, std::string>> combined = {
        {"DPM++ 2M Karras", "dpmpp_2m", "karras"},
        {"DPM++ 2M SDE Exponential", "dpmpp_2m_sde", "exponential"},
        {"DPM++ 2M SDE Heun Karras", "dpmpp_2m_sde_heun", "karras"},
        {"DPM++ 3M SDE Exponential", "dpmpp_3m_sde", "exponential"},
        {"LMS Karras", "lms", "karras"},
        {"DPM2 a Karras", "dpm_2_a", "karras"}};
    for (const auto& [web, sampler, schedule] : combined) {
        const auto named = sd::parse_sampler_name(web);
        EXPECT_EQ(named.sampler, sampler) << web;
        EXPECT_EQ(named.schedule, schedule) << web;
    }
    EXPECT_EQ(sd::parse_sampler_name("DPM fast").sampler, "DPM fast");  // unknown: unchanged, check names the choices
    EXPECT_THROW(sd::sampler_info(sd::parse_sampler_name("DPM fast").sampler), sd::Error);
    EXPECT_EQ(sd::parse_sampler_name("PLMS Karras").sampler, "PLMS Karras");  // CompVis samplers have no sigmas

    const std::vector<std::pair<std::string, std::string>> schedules = {
        {"Automatic", "automatic"}, {"Uniform", "default"}, {"Karras", "karras"},
        {"Exponential", "exponential"}, {"Polyexponential", "polyexponential"}, {"SGM Uniform", "sgm_uniform"},
        {"SGMUniform", "sgm_uniform"}, {"KL Optimal", "kl_optimal"}, {"Align Your Steps", "align_your_steps"},
        {"Simple", "simple"}, {"Normal", "normal"}, {"DDIM", "ddim"}, {"Beta", "beta"}, {"karras", "karras"}};
    for (const auto& [label, ours] : schedules) {
        EXPECT_EQ(sd::schedule_name(label), ours) << label;
        EXPECT_NO_THROW(sd::check_sampler_settings("dpmpp_2m_sde", ours)) << label;
    }
    EXPECT_EQ(sd::schedule_label("default"), "Uniform");
    EXPECT_EQ(sd::schedule_label("align_your_steps"), "Align Your Steps");
    EXPECT_EQ(sd::schedule_name("Karass"), "Karass");
}

TEST(SamplerNames, CombinedNamesAndSchedulesSettle) {
    auto s = sd::settle_sampler_names("DPM++ 2M Karras", "", "default");
    EXPECT_EQ(s.sampler, "dpmpp_2m");
    EXPECT_EQ(s.schedule, "karras");
    s = sd::settle_sampler_names("DPM++ 2M Karras", "Karras", "default");
    EXPECT_EQ(s.schedule, "karras");
    EXPECT_THROW(sd::settle_sampler_names("DPM++ 2M Karras", "Exponential", "default"), sd::Error);
    s = sd::settle_sampler_names("Euler a", "Align Your Steps", "default");
    EXPECT_EQ(s.sampler, "euler_a");
    EXPECT_EQ(s.schedule, "align_your_steps");
    s = sd::settle_sampler_names("DPM++ SDE", "", "leading");
    EXPECT_EQ(s.schedule, "leading");  // no schedule given: the current one stays
}

// "Automatic" is the web UI's choice for the sampler; discard-penultimate and eta are row options.
TEST(SamplerNames, AutomaticAndOptionsFollowTheWebUi) {
    const std::vector<std::pair<std::string, std::string>> automatic = {
        {"dpmpp_2m", "karras"},          {"dpmpp_sde", "karras"},   {"dpmpp_2m_sde", "exponential"},
        {"dpmpp_2m_sde_heun", "exponential"}, {"dpmpp_2s_a", "karras"}, {"dpmpp_3m_sde", "exponential"},
        {"euler_a", "default"},          {"euler", "default"},      {"lms", "default"},
        {"heun", "default"},             {"dpm_2", "karras"},       {"dpm_2_a", "karras"},
        {"ddim", "default"},             {"plms", "default"}};
    for (const auto& [sampler, schedule] : automatic) {
        EXPECT_EQ(sd::effective_schedule(sampler, "automatic"), schedule) << sampler;
        EXPECT_NO_THROW(sd::check_sampler_settings(sampler, "automatic")) << sampler;
    }
    EXPECT_EQ(sd::effective_schedule("euler", "karras"), "karras");
    for (const auto& s : sd::samplers()) {
        const bool discard = s.name == "dpm_2" || s.name == "dpm_2_a" || s.name == "dpmpp_3m_sde";
        EXPECT_EQ(s.has("discard_penultimate"), discard) << s.name;
        EXPECT_EQ(s.has("brownian"), s.name.find("sde") != std::string::npos) << s.name;
    }
}

// The web UI's DDIM schedule runs one step more when 1 + steps * (1000 // steps) < 1000.
TEST(SamplerNames, StepCountsOfTheWebUiSchedules) {
    EXPECT_EQ(sd::sampler_step_count("dpmpp_2m", "ddim", 12, 1000), 13);
    EXPECT_EQ(sd::sampler_step_count("dpmpp_2m", "ddim", 10, 1000), 10);
    EXPECT_EQ(sd::sampler_step_count("dpmpp_2m", "karras", 12, 1000), 12);
    EXPECT_EQ(sd::sampler_step_count("dpm_2", "ddim", 11, 1000), 12);  // made for 12 (13 sigmas), one dropped
    EXPECT_EQ(sd::ddim_schedule_indices(12, 1000).size(), 13u);
    EXPECT_EQ(sd::ddim_schedule_indices(12, 1000).front(), 997);
    EXPECT_EQ(sd::ddim_schedule_indices(12, 1000).back(), 1);
    for (int steps = 1; steps <= 1000; ++steps)
        EXPECT_EQ(sd::sampler_step_count("euler", "ddim", steps, 1000),
                  static_cast<int>(sd::ddim_schedule_indices(steps, 1000).size()))
            << steps;
    const auto simple = sd::simple_schedule_indices(9, 1000);
    EXPECT_EQ(simple.front(), 999);
    EXPECT_EQ(simple[1], 999 - 111);
    EXPECT_EQ(simple.size(), 9u);
}

// scipy.stats.beta.ppf's values at the web UI's 0.6, 0.6: the inverse of the incomplete beta.
TEST(SamplerNames, BetaQuantiles) {
    EXPECT_DOUBLE_EQ(sd::beta_quantile(0.5, 0.6, 0.6), 0.5);  // symmetric
    EXPECT_EQ(sd::beta_quantile(0, 0.6, 0.6), 0.0);
    EXPECT_EQ(sd::beta_quantile(1, 0.6, 0.6), 1.0);
    for (double p : {0.01, 0.1, 0.3, 0.7, 0.95})
        EXPECT_NEAR(sd::beta_quantile(p, 0.6, 0.6) + sd::beta_quantile(1 - p, 0.6, 0.6), 1.0, 1e-14) << p;
    // Beta(1, 1) is uniform, Beta(2, 1) has x = sqrt(p).
    EXPECT_NEAR(sd::beta_quantile(0.3, 1, 1), 0.3, 1e-15);
    EXPECT_NEAR(sd::beta_quantile(0.3, 2, 1), std::sqrt(0.3), 1e-15);
    const auto f = sd::beta_schedule_fractions(10, 0.6, 0.6);
    ASSERT_EQ(f.size(), 10u);
    EXPECT_EQ(f.front(), 1.0);
    EXPECT_EQ(f.back(), 0.0);
    EXPECT_TRUE(std::is_sorted(f.rbegin(), f.rend()));
}

TEST(SamplerNames, AlignYourStepsLists) {
    const auto eleven = sd::align_your_steps_sigmas(11, false);
    EXPECT_EQ(eleven.front(), 14.615);
    EXPECT_EQ(eleven.back(), 0.029);
    EXPECT_EQ(eleven[5], 1.396);
    EXPECT_EQ(sd::align_your_steps_sigmas(11, true)[5], 0.862);
    const auto ten = sd::align_your_steps_sigmas(10, false);
    ASSERT_EQ(ten.size(), 10u);
    EXPECT_NEAR(ten.front(), 14.615, 1e-12);
    EXPECT_NEAR(ten.back(), 0.029, 1e-15);
    EXPECT_TRUE(std::is_sorted(ten.rbegin(), ten.rend()));
    EXPECT_GT(ten[1], eleven[2]);
    EXPECT_LT(ten[1], eleven[1]);
}

TEST(SamplerNames, BetaParametersAndTreeModes) {
    EXPECT_EQ(sd::check_beta_parameter("--beta-alpha", 0.6), 0.6);
    for (double bad : {0.0, -1.0, 101.0, std::nan("")}) EXPECT_THROW(sd::check_beta_parameter("--beta-alpha", bad), sd::Error);
    EXPECT_NO_THROW(sd::check_brownian_tree("a1111"));
    EXPECT_NO_THROW(sd::check_brownian_tree("kdiffusion"));
    EXPECT_THROW(sd::check_brownian_tree("torchsde"), sd::Error);
}
