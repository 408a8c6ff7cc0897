// img2img strength arithmetic (src/core/img2img_schedule.h) against the
// timesteps the reference cases recorded (../shared/conformance/img2img and
// inpaint, args.json).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/img2img_schedule.h"
#include "core/schedule.h"
#include "sd/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<json> case_args(const std::string& suite) {
    std::vector<json> out;
    const fs::path dir = fs::path(sdtest::env("SD_SHARED_CONFORMANCE")) / suite / "cases";
    std::vector<fs::path> paths;
    for (const auto& e : fs::directory_iterator(dir))
        if (fs::exists(e.path() / "args.json")) paths.push_back(e.path() / "args.json");
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
        std::ifstream in(p);
        std::string text((std::istreambuf_iterator<char>(in)), {});
        // Python's json writes -Infinity, Infinity and NaN (in sigma lists), which JSON has not.
        for (const char* word : {"-Infinity", "Infinity", "NaN"})
            for (size_t at; (at = text.find(word)) != std::string::npos;) text.replace(at, std::strlen(word), "null");
        json j = json::parse(text);
        j["_file"] = p.string();
        out.push_back(j);
    }
    return out;
}

TEST(Img2ImgSchedule, CompVisTEncIsPythonsTruncatedFloatProduct) {
    EXPECT_EQ(sd::compvis_t_enc(0.58, 50), 28);  // 28.999999999999996
    EXPECT_EQ(sd::compvis_t_enc(0.75, 10), 7);
    EXPECT_EQ(sd::compvis_t_enc(0.3, 10), 3);  // 3.0000000000000004
    EXPECT_EQ(sd::compvis_t_enc(0.7, 10), 7);  // 7.0
    EXPECT_EQ(sd::compvis_t_enc(0.29, 100), 28);  // 28.999999999999996
    EXPECT_EQ(sd::compvis_t_enc(1.0, 10), 10);
    EXPECT_EQ(sd::compvis_t_enc(0.05, 10), 0);
}

TEST(Img2ImgSchedule, CompVisCasesNoiseOneStepAboveTheFirstStepRun) {
    int checked = 0;
    for (const auto& a : case_args("img2img")) {
        if (a["reference"] != "compvis-img2img") continue;
        SCOPED_TRACE(a["_file"].get<std::string>());
        const int steps = a["num_inference_steps"];
        const auto ddim = sd::compvis_timesteps(steps, 1000);
        EXPECT_EQ(ddim, a["ddim_timesteps"].get<std::vector<int>>());
        const auto plan = sd::compvis_img2img_plan(ddim, steps, a["strength"].get<double>());
        EXPECT_FALSE(plan.pure_noise);
        EXPECT_EQ(plan.t_enc, a["t_enc"].get<int>());
        EXPECT_EQ(plan.noise_timestep, a["stochastic_encode"]["noise_level_timestep"].get<int>());
        EXPECT_EQ(plan.t_enc, a["stochastic_encode"]["index"].get<int>());
        EXPECT_EQ(plan.timesteps, a["timesteps"].get<std::vector<int>>());
        EXPECT_EQ(plan.indices, a["step_index"].get<std::vector<int>>());
        ++checked;
    }
    EXPECT_EQ(checked, 3);
}

TEST(Img2ImgSchedule, CompVisStrengthOneStartsFromNoiseWhereTheOriginalCrashes) {
    // 10 steps: t_enc = 10 would index past the 10 DDIM timesteps.
    const auto ten = sd::compvis_timesteps(10, 1000);
    auto plan = sd::compvis_img2img_plan(ten, 10, 1.0);
    EXPECT_TRUE(plan.pure_noise);
    EXPECT_EQ(plan.noise_timestep, -1);
    EXPECT_EQ(plan.timesteps, std::vector<int>({901, 801, 701, 601, 501, 401, 301, 201, 101, 1}));
    // 15 steps: the schedule has 16 entries (1..991), the original runs: noised
    // to 991, 15 steps from 925.
    const auto fifteen = sd::compvis_timesteps(15, 1000);
    ASSERT_EQ(fifteen.size(), 16u);
    plan = sd::compvis_img2img_plan(fifteen, 15, 1.0);
    EXPECT_FALSE(plan.pure_noise);
    EXPECT_EQ(plan.noise_timestep, 991);
    ASSERT_EQ(plan.timesteps.size(), 15u);
    EXPECT_EQ(plan.timesteps.front(), 925);
    EXPECT_EQ(plan.timesteps.back(), 1);
    // Below 1 / S no step runs; the latents are noised to the lowest timestep.
    plan = sd::compvis_img2img_plan(ten, 10, 0.05);
    EXPECT_EQ(plan.t_enc, 0);
    EXPECT_TRUE(plan.timesteps.empty());
    EXPECT_EQ(plan.noise_timestep, 1);
}

TEST(Img2ImgSchedule, DiffusersCasesFollowGetTimesteps) {
    int checked = 0;
    for (const char* suite : {"img2img", "inpaint"}) {
        for (const auto& a : case_args(suite)) {
            if (a.contains("reference") && a["reference"] == "compvis-img2img") continue;
            SCOPED_TRACE(a["_file"].get<std::string>());
            const int steps = a["num_inference_steps"];
            const auto plan = sd::diffusers_img2img_plan(steps, a["strength"].get<double>());
            EXPECT_EQ(plan.init_timestep, a["init_timestep"].get<int>());
            EXPECT_EQ(plan.t_start, a["t_start"].get<int>());
            const auto all = a["scheduler_timesteps_all"].get<std::vector<double>>();
            const auto run = sd::diffusers_img2img_timesteps(all, plan);
            EXPECT_EQ(run, a["timesteps"].get<std::vector<double>>());
            ASSERT_FALSE(run.empty());
            EXPECT_EQ(run.front(), a["latent_timestep"].get<double>());  // noised to the first step run
            // The full lists of DDIM and LCM are the project's own schedules.
            const std::string sched = a["scheduler"]["class"].get<std::string>();
            std::vector<int> own;
            if (sched == "DDIMScheduler") {
                own = sd::compvis_timesteps(steps, 1000, "leading");
                std::reverse(own.begin(), own.end());
            } else if (sched == "LCMScheduler") {
                own = sd::lcm_timesteps(steps, 1000);
            }
            if (!own.empty()) EXPECT_EQ(std::vector<double>(own.begin(), own.end()), all) << sched;
            ++checked;
        }
    }
    EXPECT_EQ(checked, 11);
}

TEST(Img2ImgSchedule, DiffusersStrengthOneRunsEveryStep) {
    auto p = sd::diffusers_img2img_plan(10, 1.0);
    EXPECT_EQ(p.init_timestep, 10);
    EXPECT_EQ(p.t_start, 0);
    p = sd::diffusers_img2img_plan(10, 0.05);  // int(0.5) = 0: no step
    EXPECT_EQ(p.t_start, 10);
    EXPECT_TRUE(sd::diffusers_img2img_timesteps(std::vector<int>{901, 801}, p).empty());
    p = sd::diffusers_img2img_plan(50, 0.58);  // 28.999999999999996 -> 28
    EXPECT_EQ(p.init_timestep, 28);
    EXPECT_EQ(p.t_start, 22);
    // A second-order scheduler slices t_start * order entries.
    EXPECT_EQ(sd::diffusers_img2img_timesteps(std::vector<int>{5, 4, 3, 2, 1, 0}, sd::DiffusersImg2ImgPlan{2, 1}, 2),
              std::vector<int>({3, 2, 1, 0}));
}

TEST(Img2ImgSchedule, StrengthMustBeAboveZeroAndAtMostOne) {
    EXPECT_EQ(sd::check_strength("--strength", 1.0), 1.0);
    EXPECT_EQ(sd::check_strength("--strength", 1e-9), 1e-9);
    for (double bad : {0.0, -0.1, 1.0000001, 2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        try {
            sd::check_strength("--strength", bad);
            ADD_FAILURE() << bad << " accepted";
        } catch (const sd::Error& e) {
            EXPECT_EQ(std::string(e.what()).rfind("--strength must be above 0 and at most 1, got ", 0), 0u) << e.what();
        }
    }
}

}  // namespace
