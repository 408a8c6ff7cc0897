// The SD-Turbo recipe (tests/fixtures/turbo): --sampler euler_a --schedule
// trailing --scale 1, diffusers' EulerAncestralDiscreteScheduler with
// "trailing" timesteps on the tiny SD 2.x eps model: timesteps and sigmas, the
// S + 1 random draws, every UNet call and step replayed, and each case
// through the CLI.
#include <gtest/gtest.h>

#include "conformance_util.h"
#include "engine/sampling_loop.h"
#include "core/schedule.h"
#include "test_util.h"

namespace {

const std::vector<std::string> kCases = {"turbo1_64x64", "turbo4_64x96"};

std::string case_dir(const std::string& c) { return sdtest::fixtures() + "/turbo/cases/" + c; }
at::Tensor load(const std::string& c, const std::string& file) { return sdtest::load_tensor(case_dir(c) + "/" + file); }
nlohmann::json args(const std::string& c) { return sdtest::read_json(case_dir(c) + "/args.json"); }
std::string eps_model() { return sdtest::test_models() + "/tiny2-eps-st"; }
double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }
int steps_of(const nlohmann::json& a) { return a["num_inference_steps"].get<int>(); }

double max_rel(const at::Tensor& got, const at::Tensor& ref) {
    auto g = got.to(at::kDouble), r = ref.to(at::kDouble);
    return ((g - r).abs() / r.abs().clamp_min(1e-30)).max().item<double>();
}

}  // namespace

TEST(TurboSchedule, TimestepsAndSigmasAreTheReferences) {
    const auto ac = sdtest::model_alphas_cumprod(eps_model());
    for (const auto& c : kCases) {
        const auto a = args(c);
        const int steps = steps_of(a);
        std::vector<int> want;
        for (double t : a["timesteps"].get<std::vector<double>>()) want.push_back(static_cast<int>(t));
        EXPECT_EQ(sd::trailing_timesteps(steps, 1000), want) << c;
        auto ref = load(c, "sigmas.npy");
        auto got = sd::k_sigmas("trailing", steps, ac);
        ASSERT_EQ(got.sizes(), ref.sizes()) << c;
        EXPECT_EQ(got[-1].item<float>(), 0.0f) << c;
        EXPECT_LE(max_rel(got.slice(0, 0, -1), ref.slice(0, 0, -1)), 1e-6) << c;
        EXPECT_NEAR(got.max().item<double>(), a["euler_ancestral"]["init_noise_sigma"].get<double>(), 1e-6 * 14.62) << c;
        // The must-FAIL variation: "leading" timesteps (steps_offset 1) are other sigmas.
        if (steps > 1) {
            auto leading = sd::compvis_timesteps(steps, 1000, "leading");
            std::reverse(leading.begin(), leading.end());
            EXPECT_NE(leading, want) << c;
        }
    }
}

TEST(TurboSchedule, StartNoiseAndADrawInEveryStep) {
    for (const auto& c : kCases) {
        const auto a = args(c);
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
        auto start = load(c, "start_noise.npy"), step_noise = load(c, "step_noise.npy");
        EXPECT_TRUE(at::equal(at::randn(start.sizes(), gen), start)) << c;
        ASSERT_EQ(step_noise.size(0), steps_of(a)) << c << ": one draw per step, the last one too";
        for (int64_t k = 0; k < step_noise.size(0); ++k)
            EXPECT_TRUE(at::equal(at::randn(start.sizes(), gen), step_noise[k])) << c << " draw " << k;
    }
}

// The recorded UNet outputs replayed: the sampler must ask for the recorded
// x / sqrt(sigma^2 + 1) and float t, walk the recorded steps, and draw S + 1 tensors.
TEST(TurboSampler, ReplayReferenceUnet) {
    c10::InferenceMode guard;
    const auto ac = sdtest::model_alphas_cumprod(eps_model());
    for (const auto& c : kCases) {
        const auto a = args(c);
        auto noise = load(c, "start_noise.npy");
        const int64_t n = noise.size(0);
        sdtest::ReplayedUnet unet{load(c, "unet_x.npy"), load(c, "unet_t.npy"), load(c, "unet_out.npy"), n, 1.0, c};
        unet.guided = false;
        EXPECT_EQ(unet.ts.scalar_type(), at::kFloat);
        auto steps_x = load(c, "steps_x.npy"), latents = load(c, "latents.npy");
        sd::ModelFn model = [&](const at::Tensor& x, const at::Tensor& t) {
            EXPECT_EQ(t.scalar_type(), at::kFloat) << c;
            return unet(x, t);
        };
        sd::StepFn on_step = [&](int i, int total, const at::Tensor& x, const at::Tensor&) {
            EXPECT_EQ(total, steps_of(a));
            EXPECT_LE(sdtest::max_abs_diff(x, steps_x[i]), 1e-4 * max_abs(steps_x)) << c << " step " << i;
        };
        sd::SamplerSettings s;
        s.sampler = "euler_a";
        s.schedule = "trailing";
        s.steps = steps_of(a);
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
        auto out = sd::sample(s, model, at::randn(noise.sizes(), gen), ac, gen, on_step);
        EXPECT_EQ(unet.calls, unet.xs.size(0)) << c;
        EXPECT_LE(sdtest::max_abs_diff(out, latents), 1e-4 * max_abs(latents)) << c;
        at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
        for (int i = 0; i < steps_of(a) + 1; ++i) at::randn(noise.sizes(), fresh);
        EXPECT_TRUE(at::equal(at::randn(noise.sizes(), gen), at::randn(noise.sizes(), fresh))) << c << ": S + 1 draws";
    }
}

// ---- through the CLI ----

struct TurboCli : ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// guidance_scale 0 (diffusers: no CFG) is this tool's --scale 1, the cond alone.
TEST_P(TurboCli, MatchesReferenceRun) {
    const auto& [c, from] = GetParam();
    const auto a = args(c);
    const std::string out = sdtest::temp_dir();
    sdtest::check_cli_run(case_dir(c),
                          {sdtest::cli(), "--model", sdtest::test_models() + "/tiny2-eps-" + from, "--outdir", out + "/img",
                           "--quiet", "--threads", "1", "--sampler", "euler_a", "--schedule", "trailing", "--scale", "1",
                           "--steps", std::to_string(steps_of(a)), "--seed", std::to_string(a["seed"].get<long long>()),
                           "--H", std::to_string(a["H"].get<int>()), "--W", std::to_string(a["W"].get<int>()),
                           "--n_samples", std::to_string(a["n"].get<int>()), "--prompt", a["prompt"].get<std::string>()},
                          out);
}

INSTANTIATE_TEST_SUITE_P(TurboCases, TurboCli, ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("st", "ckpt")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// DPM++ 2M has no diffusers trailing reference: refused in one line, before the model loads.
TEST(TurboCliErrors, TrailingWithDpmpp2mIsOneLine) {
    auto r = sdtest::run({sdtest::cli(), "--model", sdtest::temp_dir() + "/no-model", "--prompt", "a", "--sampler",
                          "dpmpp_2m", "--schedule", "trailing"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("euler_a"), std::string::npos) << r.err;
}
