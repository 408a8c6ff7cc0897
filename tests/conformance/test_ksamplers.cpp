// The k-diffusion samplers (Euler, Euler ancestral, DPM++ 2M; model and Karras
// sigmas) against the reference runs of tiny/cases_k: sigmas, continuous
// timesteps, every denoiser call, every step, the random draws, and the CLI.
#include <gtest/gtest.h>

#include <torch/script.h>

#include "conformance_util.h"
#include "engine/stage_loader.h"
#include "engine/sampling_loop.h"
#include "test_util.h"

namespace {

const std::vector<std::string> kCases = {"pk1_euler_model10_64x64", "pk2_euler_a_karras10_64x96",
                                         "pk3_dpmpp2m_karras15_64x64", "pk4_euler_a_model12_batch2_64x64"};

std::string case_dir(const std::string& c) { return sdtest::fixtures() + "/tiny/cases_k/" + c; }
at::Tensor load(const std::string& c, const std::string& file) { return sdtest::load_tensor(case_dir(c) + "/" + file); }
nlohmann::json args(const std::string& c) { return sdtest::read_json(case_dir(c) + "/args.json"); }
std::string tiny_model() { return sdtest::test_models() + "/tiny-st"; }

sd::SamplerSettings settings(const nlohmann::json& a) {
    sd::SamplerSettings s;
    s.sampler = a["sampler"] == "euler_ancestral" ? "euler_a" : a["sampler"].get<std::string>();
    s.schedule = a["schedule"] == "karras" ? "karras" : "default";
    s.steps = a["steps"].get<int>();
    return s;
}

double rel_max(const at::Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace

TEST(KSigmas, MatchReferenceWithin1e6Relative) {
    const auto ac = sdtest::model_alphas_cumprod(tiny_model());
    auto ms = sd::model_sigmas(ac);
    EXPECT_NEAR(ms[0].item<double>(), 0.0291675, 1e-7);
    EXPECT_NEAR(ms[999].item<double>(), 14.614643, 1e-5);
    for (const auto& c : kCases) {
        const auto a = args(c);
        auto ref = at::tensor(a["sigmas"].get<std::vector<float>>());
        auto got = sd::k_sigmas(settings(a).schedule, a["steps"].get<int>(), ac);
        ASSERT_EQ(got.sizes(), ref.sizes()) << c;
        EXPECT_EQ(got[-1].item<float>(), 0.0f) << c;
        auto rel = ((got.to(at::kDouble) - ref.to(at::kDouble)).abs() / ref.to(at::kDouble).clamp_min(1e-30)).slice(0, 0, -1);
        EXPECT_LE(rel.max().item<double>(), 1e-6) << c;
        EXPECT_TRUE(at::equal(got, load(c, "sigmas.npy"))) << c << " (bit-exact float32 sigmas)";
    }
}

TEST(KSigmas, ContinuousTimestepsOfEveryCall) {
    const auto ac = sdtest::model_alphas_cumprod(tiny_model());
    auto log_sigmas = sd::model_sigmas(ac).log();
    double worst = 0;
    for (const auto& c : kCases) {
        auto sig = load(c, "den_sigma.npy"), ts = load(c, "unet_t.npy");
        for (int64_t k = 0; k < sig.size(0); ++k) {
            auto t = sd::sigma_to_t(sig[k], log_sigmas);
            EXPECT_EQ(t.scalar_type(), at::kFloat);
            worst = std::max(worst, sdtest::max_abs_diff(t, ts[k].slice(0, 0, sig.size(1))));
        }
    }
    EXPECT_LE(worst, 1e-4) << "t is fractional and must not be rounded";
}

TEST(KSamplers, StartNoiseAndStepNoiseComeFromOneGenerator) {
    for (const auto& c : kCases) {
        const auto a = args(c);
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
        auto start = load(c, "start_noise.npy");
        EXPECT_TRUE(at::equal(at::randn(start.sizes(), gen), start)) << c;
        if (a["sampler"] == "euler_ancestral") {
            auto step_noise = load(c, "step_noise.npy");
            for (int64_t k = 0; k < step_noise.size(0); ++k)
                EXPECT_TRUE(at::equal(at::randn(start.sizes(), gen), step_noise[k])) << c << " draw " << k;
        }
    }
}

namespace {

// Replays the reference UNet outputs in call order through the sampler, as an
// eps model or (converted) as a v model, and checks every call and step.
void replay(const std::string& c, sd::Parameterization p) {
    c10::InferenceMode guard;
    const auto a = args(c);
    const auto ac = sdtest::model_alphas_cumprod(tiny_model());
    auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
    auto den_x = load(c, "den_x.npy"), den_sigma = load(c, "den_sigma.npy"), den_out = load(c, "den_out.npy");
    auto steps_x = load(c, "steps_x.npy"), latents = load(c, "latents.npy");
    auto noise = load(c, "start_noise.npy");
    const int64_t n = noise.size(0);
    const double scale = a["scale"].get<double>();
    sdtest::ReplayedUnet unet{xs, ts, outs, n, scale, c};
    sd::ModelFn model = [&](const at::Tensor& x, const at::Tensor& t) {
        auto eps = unet(x, t);
        if (p == sd::Parameterization::Eps) return eps;
        // The v a v model would give here: v = (eps - sqrt(1 - a) x) / sqrt(a), a = 1 / (1 + sigma^2).
        const double sigma = den_sigma[unet.calls - 1][0].item<double>();
        const double a_bar = 1.0 / (1.0 + sigma * sigma);
        return (eps.to(at::kDouble) - std::sqrt(1 - a_bar) * x.to(at::kDouble)).div(std::sqrt(a_bar)).to(at::kFloat);
    };
    const double tol = 1e-4 * rel_max(steps_x);
    sd::StepFn on_step = [&](int i, int total, const at::Tensor& x, const at::Tensor& denoised) {
        EXPECT_EQ(total, a["steps"].get<int>());
        EXPECT_LE(sdtest::max_abs_diff(denoised, den_out[i]), 1e-4 * rel_max(den_out[i])) << c << " step " << i;
        EXPECT_LE(sdtest::max_abs_diff(x, steps_x[i]), tol) << c << " step " << i;
        if (i + 1 < total) EXPECT_LE(sdtest::max_abs_diff(x, den_x[i + 1]), tol) << c << " step " << i;
    };
    auto s = settings(a);
    s.parameterization = p;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
    auto start = at::randn(noise.sizes(), gen);
    auto out = sd::sample(s, model, start, ac, gen, on_step);
    EXPECT_EQ(unet.calls, xs.size(0)) << c << ": number of UNet calls";
    EXPECT_LE(sdtest::max_abs_diff(out, latents), 1e-4 * rel_max(latents)) << c;
    // The sampler drew exactly the reference's number of tensors: the next draw
    // (the next batch's start noise) is the reference's next one.
    at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
    for (int i = 0; i <= a["rng_draw_count"].get<int>(); ++i) at::randn(noise.sizes(), fresh);
    EXPECT_TRUE(at::equal(at::randn(noise.sizes(), gen), at::randn(noise.sizes(), fresh))) << c << ": generator draws";
}

}  // namespace

TEST(KSamplers, ReplayReferenceUnetEps) {
    for (const auto& c : kCases) replay(c, sd::Parameterization::Eps);
}

// A v model whose outputs are the reference's eps converted to v must walk the same steps.
TEST(KSamplers, ReplayReferenceUnetAsVModel) {
    for (const auto& c : kCases) replay(c, sd::Parameterization::V);
}

TEST(KSamplers, UnetWithFractionalTimesteps) {
    c10::InferenceMode guard;
    auto unet = sd::load_stage(tiny_model() + "/unet.pt");
    for (const auto& c : kCases) {
        auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
        auto ctx = load(c, "unet_context.npy");
        for (int64_t k = 0; k < xs.size(0); k += 3) {
            auto out = unet.forward({xs[k], ts[k], ctx}).toTensor();
            EXPECT_LE(sdtest::max_abs_diff(out, outs[k]), 2e-4) << c << " call " << k;
        }
    }
}

TEST(KSamplers, UnknownNamesAreOneLineErrors) {
    EXPECT_THROW(sd::check_sampler_settings("heun9", "default"), std::runtime_error);
    EXPECT_THROW(sd::check_sampler_settings("euler", "exponentail"), std::runtime_error);
    EXPECT_THROW(sd::check_sampler_settings("plms", "karras"), std::runtime_error);
    EXPECT_NO_THROW(sd::check_sampler_settings("dpmpp_2m", "karras"));
    EXPECT_NO_THROW(sd::check_sampler_settings("ddim", "default"));
}

// ---- through the CLI ----

struct KConformance : ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(KConformance, MatchesReferenceRun) {
    const auto& [name, model] = GetParam();
    sdtest::check_cli_case(case_dir(name), sdtest::test_models() + "/" + model, {"--threads", "1"});
}

INSTANTIATE_TEST_SUITE_P(TinyKCases, KConformance,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("tiny-st", "tiny-ckpt")),
                         [](const auto& info) {
                             return std::get<0>(info.param) + (std::get<1>(info.param) == "tiny-st" ? "_st" : "_ckpt");
                         });

TEST(KConformanceCli, ScheduleKarrasWithPlmsIsABadInput) {
    auto r = sdtest::run({sdtest::cli(), "--model", tiny_model(), "--outdir", sdtest::temp_dir(), "--quiet", "--prompt", "a",
                          "--H", "64", "--W", "64", "--steps", "2", "--sampler", "plms", "--schedule", "karras"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("karras"), std::string::npos) << r.err;
}
