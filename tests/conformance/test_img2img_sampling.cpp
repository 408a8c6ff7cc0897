// img2img and inpainting at the sampler stage (issue 33): every public case of
// shared/conformance/img2img and shared/conformance/inpaint run through
// sd::sample from the case's init latents and start noise, with a generator
// positioned as the reference's and the reference UNet replayed: the start
// latents, every UNet input and timestep, every step, the final latents and
// the number of random draws, with the READMEs' criteria.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "conformance_util.h"
#include "core/schedule.h"
#include "engine/sampling_loop.h"
#include "sd/error.h"
#include "test_util.h"

namespace {

std::string shared() { return sdtest::env("SD_SHARED_CONFORMANCE"); }
std::string case_dir(const std::string& kind, const std::string& c) { return shared() + "/" + kind + "/cases/" + c; }
std::vector<float> tiny_alphas() { return sdtest::model_alphas_cumprod(sdtest::test_models() + "/tiny-st"); }
double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// The public cases of a fixture folder, from its cases/index.json.
std::vector<std::string> case_names(const std::string& kind) {
    const std::string path = shared() + "/" + kind + "/cases/index.json";
    EXPECT_TRUE(std::filesystem::is_regular_file(path)) << path;
    const nlohmann::json index = sdtest::read_json(path);
    std::vector<std::string> names;
    for (const auto& item : index.items()) names.push_back(item.key());
    return names;
}

struct Case {
    std::string kind, name, dir;
    nlohmann::json args;
    at::Tensor load(const std::string& file) const { return sdtest::load_tensor(dir + "/" + file); }
    bool has(const std::string& file) const { return std::filesystem::exists(dir + "/" + file); }
    bool compvis() const { return args["reference"].get<std::string>().rfind("compvis", 0) == 0; }
    int64_t n() const { return args["n"].get<int64_t>(); }
    bool nine_channels() const { return args.contains("model") && args["model"].is_object() &&
                                        args["model"]["unet_in_channels"].get<int>() == 9; }
    bool blends() const { return kind == "inpaint" && !nine_channels(); }
};

Case open_case(const std::string& kind, const std::string& name) {
    Case c{kind, name, case_dir(kind, name), {}};
    // Python's json writes DPM++'s lambda_min_clipped as -Infinity, which is not JSON.
    std::string text = sdtest::read_text(c.dir + "/args.json");
    for (size_t at = text.find("-Infinity"); at != std::string::npos; at = text.find("-Infinity")) text.replace(at, 9, "null");
    c.args = nlohmann::json::parse(text);
    return c;
}

// The tool's settings for a case: CompVis is ddim with the default schedule;
// diffusers' schedulers run with their own "leading" spacing, DPM++ with
// Karras sigmas as --schedule karras.
sd::SamplerSettings settings(const Case& c) {
    sd::SamplerSettings s;
    s.steps = c.args["num_inference_steps"].get<int>();
    s.strength = c.args["strength"].get<double>();
    if (c.compvis()) {
        s.sampler = "ddim";
        s.schedule = "default";
        return s;
    }
    const std::string cls = c.args["scheduler"]["class"].get<std::string>();
    const auto& cfg = c.args["scheduler"]["config"];
    EXPECT_EQ(cfg["timestep_spacing"], "leading") << c.name;
    if (cls == "DDIMScheduler") {
        s.sampler = "ddim";
        s.schedule = "leading";
    } else if (cls == "EulerAncestralDiscreteScheduler") {
        s.sampler = "euler_a";
        s.schedule = "leading";
    } else if (cls == "DPMSolverMultistepScheduler") {
        s.sampler = "dpmpp_2m";
        s.schedule = cfg["use_karras_sigmas"].get<bool>() ? "karras" : "leading";
    } else if (cls == "LCMScheduler") {
        s.sampler = "lcm";
        s.schedule = "default";
    } else {
        ADD_FAILURE() << c.name << ": scheduler " << cls << " not mapped";
    }
    return s;
}

// Seeds a generator and makes the reference's draws before the sampler's
// (posterior noise of the image, start noise, posterior noise of the masked
// image, in the case's order), checking each against its file bit for bit.
// Returns the start noise.
at::Tensor position_generator(const Case& c, at::Generator& gen) {
    at::Tensor start;
    for (const auto& d : c.args["draws"]) {
        const std::string where = d["where"].get<std::string>();
        if (where.find("scheduler.step") != std::string::npos || where.find("p_sample_ddim") != std::string::npos) break;
        auto draw = at::randn(d["shape"].get<std::vector<int64_t>>(), gen);
        std::string file;
        if (where == "stochastic_encode" || where == "pipeline.prepare_latents") file = "start_noise.npy";
        else if (!start.defined()) file = "encode_noise.npy";  // the init image's posterior
        else file = "masked_image_encode_noise.npy";
        EXPECT_TRUE(at::equal(draw, c.load(file))) << c.name << ": draw '" << where << "' is not " << file;
        if (file == "start_noise.npy") start = draw;
    }
    EXPECT_TRUE(start.defined()) << c.name << ": no start noise among the draws";
    return start;
}

// The init latents the sampler starts from, or none: a 9-channel model at
// strength 1.0 does not encode the image (the run is txt2img's).
at::Tensor init_latents(const Case& c) { return c.has("init_latents.npy") ? c.load("init_latents.npy") : at::Tensor(); }

struct Result {
    at::Tensor first_x, out;  // the first UNet input (x_start scaled), the final latents
    int64_t calls = 0;
};

// Runs a case through sd::sample. checked: the replayed UNet checks every
// call (x and t); otherwise it only returns the recorded outputs in order.
Result run_case(const Case& c, const sd::SamplerSettings& s, bool checked, const sd::StepFn& on_step = nullptr,
                bool blend = true) {
    c10::InferenceMode guard;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(c.args["seed"].get<uint64_t>());
    at::Tensor noise = position_generator(c, gen);
    const double scale = c.args["guidance_scale"].get<double>();
    sdtest::ReplayedUnet unet{c.load("unet_x.npy"), c.load("unet_t.npy"), c.load("unet_out.npy"), c.n(), scale, c.name};
    unet.guided = scale > 1.0;
    Result r;
    sd::ModelFn model = [&](const at::Tensor& x, const at::Tensor& t) {
        if (!r.first_x.defined()) r.first_x = x.clone();
        ++r.calls;
        if (checked) return unet(x, t);
        if (r.calls > unet.outs.size(0)) return at::zeros_like(x);
        auto out = unet.outs[r.calls - 1];
        if (!unet.guided) return out;
        auto parts = out.chunk(2);
        return parts[0] + scale * (parts[1] - parts[0]);
    };
    sd::InpaintBlend mask{c.blends() ? c.load("mask_latent.npy") : at::Tensor()};
    const at::Tensor x0 = init_latents(c);
    r.out = sd::sample(s, model, noise, tiny_alphas(), gen, on_step, x0, c.blends() && blend ? &mask : nullptr);
    // The sampler drew what the reference drew: the next draw is the reference's next one.
    // Not for DDIM without init latents (a 9-channel model at strength 1.0):
    // that is txt2img, whose DDIM draws (and discards) a tensor per step as
    // CompVis's does, while diffusers' DDIMScheduler draws none; the images
    // of the batch are the same, only a later batch's start noise would differ.
    if (checked && !(s.sampler == "ddim" && !x0.defined())) {
        at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(c.args["seed"].get<uint64_t>());
        for (const auto& d : c.args["draws"]) at::randn(d["shape"].get<std::vector<int64_t>>(), fresh);
        EXPECT_TRUE(at::equal(at::randn(noise.sizes(), gen), at::randn(noise.sizes(), fresh))) << c.name << ": random draws";
    }
    return r;
}

// x_start from the first UNet input: diffusers' Euler schedulers scale it by
// 1 / sqrt(sigma^2 + 1) first (scale_model_input).
at::Tensor x_start_of(const Case& c, const Result& r) {
    const int64_t n = c.n();
    at::Tensor x = r.first_x.slice(0, 0, n);
    if (!c.compvis() && c.args["scheduler"]["class"] == "EulerAncestralDiscreteScheduler") {
        const auto sigmas = c.args["sigmas"].get<std::vector<double>>();
        const auto all = c.args["scheduler_timesteps_all"].get<std::vector<double>>();
        const double t0 = c.args["timesteps"][0].get<double>();
        const size_t i = static_cast<size_t>(std::find(all.begin(), all.end(), t0) - all.begin());
        x = (x.to(at::kDouble) * std::sqrt(sigmas.at(i) * sigmas.at(i) + 1)).to(at::kFloat);
    }
    return x;
}

void check_case(const Case& c) {
    SCOPED_TRACE(c.kind + "/" + c.name);
    const auto s = settings(c);
    const auto timesteps = c.args["timesteps"];
    const int K = static_cast<int>(timesteps.size());
    ASSERT_EQ(sd::img2img_step_count(s.sampler, s.schedule, s.steps, s.strength, 1000), K);
    const at::Tensor steps_x = c.load(c.blends() ? "steps_latents.npy" : "steps_x.npy");
    const at::Tensor latents = c.load("latents.npy");
    // CompVis's pred_x0, LCM's denoised
    const at::Tensor pred_x0 = c.has("steps_pred_x0.npy") ? c.load("steps_pred_x0.npy") : at::Tensor();
    int seen = 0;
    sd::StepFn on_step = [&](int i, int total, const at::Tensor& x, const at::Tensor& x0) {
        ++seen;
        EXPECT_EQ(total, K);
        EXPECT_LE(sdtest::max_abs_diff(x, steps_x[i]), 1e-4 * max_abs(steps_x[i])) << "step " << i;
        if (pred_x0.defined())
            EXPECT_LE(sdtest::max_abs_diff(x0, pred_x0[i]), 1e-4 * max_abs(pred_x0[i])) << "pred_x0 of step " << i;
    };
    const Result r = run_case(c, s, true, on_step);
    EXPECT_EQ(r.calls, K) << "UNet calls";
    EXPECT_EQ(seen, K);
    const at::Tensor x_start = c.load("x_start.npy");
    EXPECT_LE(sdtest::max_abs_diff(x_start_of(c, r), x_start), 1e-4 * max_abs(x_start)) << "x_start";
    EXPECT_LE(sdtest::max_abs_diff(r.out, latents), 1e-4 * max_abs(latents)) << "latents";
}

}  // namespace

TEST(Img2ImgSampling, EveryPublicImg2ImgCase) {
    const auto names = case_names("img2img");
    ASSERT_GE(names.size(), 8u);
    for (const auto& name : names) check_case(open_case("img2img", name));
}

TEST(Img2ImgSampling, EveryPublicInpaintCase) {
    const auto names = case_names("inpaint");
    ASSERT_GE(names.size(), 6u);
    for (const auto& name : names) check_case(open_case("inpaint", name));
}

// diffusers' schedules for the k-samplers: Euler's leading sigmas and DPM++'s
// Karras sigmas and rounded timesteps, bit for bit.
TEST(Img2ImgSampling, DiffusersSigmasAndTimesteps) {
    const auto ac = tiny_alphas();
    int checked = 0;
    for (const std::string kind : {"img2img", "inpaint"}) {
        for (const auto& name : case_names(kind)) {
            const Case c = open_case(kind, name);
            if (c.compvis() || !c.has("sigmas.npy")) continue;
            const auto s = settings(c);
            const at::Tensor want = c.load("sigmas.npy");
            const auto all = c.args["scheduler_timesteps_all"].get<std::vector<double>>();
            // Within 1e-5 relative, not bit for bit: diffusers computes alphas_cumprod
            // in float32, CompVis (the model's table) in float64; at t = 1 that
            // makes 2.5e-6 of sigma.
            auto rel = [](const at::Tensor& got, const at::Tensor& ref) {
                EXPECT_EQ(got.sizes(), ref.sizes());
                auto g = got.to(at::kDouble).slice(0, 0, -1), r = ref.to(at::kDouble).slice(0, 0, -1);
                EXPECT_EQ(got[-1].item<float>(), 0.0f);
                return ((g - r).abs() / r).max().item<double>();
            };
            if (s.sampler == "euler_a") {
                EXPECT_LE(rel(sd::k_sigmas("leading", s.steps, ac), want), 1e-5) << name;
            } else if (s.schedule == "karras") {
                auto [sigmas, ts] = sd::dpm_karras_schedule(s.steps, ac);
                EXPECT_LE(rel(sigmas, want), 1e-5) << name;
                EXPECT_EQ(std::vector<double>(ts.begin(), ts.end()), all) << name;
            } else {
                const auto ts = sd::dpm_leading_timesteps(s.steps, 1000);
                EXPECT_EQ(std::vector<double>(ts.begin(), ts.end()), all) << name;
            }
            ++checked;
        }
    }
    EXPECT_GE(checked, 4);
}

// txt2img with dpmpp_2m --schedule leading is diffusers' DPMSolverMultistepScheduler
// from x_T = noise (init_noise_sigma 1): started from the strength-1.0 img2img
// case's x_start, whose loop is the same, it walks that case's steps.
TEST(Img2ImgSampling, DpmLeadingTxt2ImgWalksTheReferenceSteps) {
    c10::InferenceMode guard;
    const Case c = open_case("img2img", "d_dpmpp2m10_s1.0_negative_64x64");
    const auto s = settings(c);
    ASSERT_EQ(s.schedule, "leading");
    ASSERT_EQ(c.args["scheduler_timesteps_all"], c.args["timesteps"]);  // every step runs
    sdtest::ReplayedUnet unet{c.load("unet_x.npy"), c.load("unet_t.npy"), c.load("unet_out.npy"), c.n(),
                              c.args["guidance_scale"].get<double>(), c.name};
    sd::ModelFn model = [&](const at::Tensor& x, const at::Tensor& t) { return unet(x, t); };
    const at::Tensor steps_x = c.load("steps_x.npy"), latents = c.load("latents.npy");
    sd::StepFn on_step = [&](int i, int, const at::Tensor& x, const at::Tensor&) {
        EXPECT_LE(sdtest::max_abs_diff(x, steps_x[i]), 1e-4 * max_abs(steps_x[i])) << "step " << i;
    };
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
    auto out = sd::sample(s, model, c.load("x_start.npy"), tiny_alphas(), gen, on_step);
    EXPECT_EQ(unet.calls, unet.xs.size(0));
    EXPECT_LE(sdtest::max_abs_diff(out, latents), 1e-4 * max_abs(latents));
}

// Must fail: the other convention's noise level. CompVis noised at the first
// step's level (t_enc - 1, what diffusers' arithmetic does on the same
// timesteps), and diffusers noised one DDIM step higher (CompVis's).
TEST(Img2ImgSampling, TheOtherConventionFails) {
    for (const std::string name : {"cv_ddim10_s0.75_64x64", "d_ddim10_s0.75_64x64"}) {
        const Case c = open_case("img2img", name);
        auto s = settings(c);
        s.schedule = c.compvis() ? "leading" : "default";
        const Result r = run_case(c, s, false);
        const at::Tensor x_start = c.load("x_start.npy"), latents = c.load("latents.npy");
        EXPECT_GT(sdtest::max_abs_diff(x_start_of(c, r), x_start), 100 * 1e-4 * max_abs(x_start)) << name;
        EXPECT_GT(sdtest::max_abs_diff(r.out, latents), 100 * 1e-4 * max_abs(latents)) << name;
    }
}

// Must fail: the 4-channel inpainting without the latent blend.
TEST(Img2ImgSampling, InpaintWithoutTheBlendFails) {
    for (const auto& name : case_names("inpaint")) {
        const Case c = open_case("inpaint", name);
        if (!c.blends()) continue;
        const Result r = run_case(c, settings(c), false, nullptr, false);
        const at::Tensor latents = c.load("latents.npy");
        EXPECT_GT(sdtest::max_abs_diff(r.out, latents), 100 * 1e-4 * max_abs(latents)) << name;
    }
}

namespace {

// A run with a recording model (eps 0), from init latents of ones and noise of twos.
struct Recorded {
    std::vector<int64_t> ts;
    at::Tensor first_x, out;
};

Recorded record(const sd::SamplerSettings& s, const sd::InpaintBlend* blend = nullptr) {
    c10::InferenceMode guard;
    Recorded rec;
    sd::ModelFn model = [&](const at::Tensor& x, const at::Tensor& t) {
        if (!rec.first_x.defined()) rec.first_x = x.clone();
        rec.ts.push_back(t[0].item<int64_t>());
        return at::zeros_like(x);
    };
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
    rec.out = sd::sample(s, model, at::full({1, 4, 2, 2}, 2.0f), tiny_alphas(), gen, nullptr, at::ones({1, 4, 2, 2}), blend);
    return rec;
}

}  // namespace

// CompVis img2img.py fails at strength 1.0 when the DDIM table has exactly
// `steps` entries; the tool noises to the top DDIM timestep and runs them all.
// Where the table is longer (15 steps: 16 entries), it follows img2img.py.
TEST(Img2ImgSampling, CompVisStrengthOne) {
    const auto ac = tiny_alphas();
    sd::SamplerSettings s;
    s.sampler = "ddim";
    s.schedule = "default";
    s.steps = 10;
    s.strength = 1.0;
    auto rec = record(s);
    EXPECT_EQ(rec.ts, (std::vector<int64_t>{901, 801, 701, 601, 501, 401, 301, 201, 101, 1}));
    const float a = ac[901];
    EXPECT_NEAR(rec.first_x[0][0][0][0].item<double>(), std::sqrt(a) + 2 * std::sqrt(1 - a), 1e-6);
    s.steps = 15;
    rec = record(s);
    ASSERT_EQ(rec.ts.size(), 15u);
    EXPECT_EQ(rec.ts.front(), 925);  // noised at ddim_timesteps[15] = 991, one step above
    EXPECT_NEAR(rec.first_x[0][0][0][0].item<double>(), std::sqrt(ac[991]) + 2 * std::sqrt(1 - ac[991]), 1e-6);
    EXPECT_EQ(sd::img2img_step_count("ddim", "default", 15, 1.0, 1000), 15);
}

// Strength below 1 / steps: CompVis runs no step and returns the noised
// latents (ddim_timesteps[0]); diffusers' arithmetic runs none and returns the
// init latents (diffusers itself fails there with an empty timestep list).
TEST(Img2ImgSampling, TooSmallAStrengthRunsNoStep) {
    const auto ac = tiny_alphas();
    sd::SamplerSettings s;
    s.sampler = "ddim";
    s.schedule = "default";
    s.steps = 10;
    s.strength = 0.05;
    auto rec = record(s);
    EXPECT_TRUE(rec.ts.empty());
    EXPECT_NEAR(rec.out[0][0][0][0].item<double>(), std::sqrt(ac[1]) + 2 * std::sqrt(1 - ac[1]), 1e-6);
    for (const std::string sampler : {"ddim", "euler_a", "dpmpp_2m", "lcm"}) {
        s.sampler = sampler;
        s.schedule = sampler == "lcm" ? "default" : "leading";
        s.steps = 4;
        s.strength = 0.2;
        rec = record(s);
        EXPECT_TRUE(rec.ts.empty()) << sampler;
        EXPECT_TRUE(at::equal(rec.out, at::ones({1, 4, 2, 2}))) << sampler;
    }
}

// The blend at strength 1.0 starts from the noise alone (times init_noise_sigma),
// and keeps the unmasked area at the init latents after the last step.
TEST(Img2ImgSampling, InpaintBlendAtStrengthOne) {
    sd::SamplerSettings s;
    s.sampler = "ddim";
    s.schedule = "leading";
    s.steps = 4;
    s.strength = 1.0;
    auto mask = at::zeros({1, 1, 2, 2});
    mask[0][0][0][0] = 1;
    sd::InpaintBlend blend{mask};
    auto rec = record(s, &blend);
    EXPECT_EQ(rec.ts, (std::vector<int64_t>{751, 501, 251, 1}));
    EXPECT_TRUE(at::equal(rec.first_x, at::full({1, 4, 2, 2}, 2.0f)));
    EXPECT_TRUE(at::equal(rec.out[0][0][1][1], at::ones({})));       // kept: the init latents
    EXPECT_FALSE(at::equal(rec.out[0][0][0][0], at::ones({})));      // repainted
}

TEST(Img2ImgSampling, RefusedSettingsAreErrors) {
    sd::SamplerSettings s;
    s.sampler = "plms";
    s.steps = 10;
    s.strength = 0.5;
    EXPECT_THROW(record(s), sd::Error);
    s.sampler = "ddim";
    for (double bad : {0.0, -0.5, 1.5}) {
        s.strength = bad;
        EXPECT_THROW(record(s), sd::Error) << bad;
    }
    s.strength = 0.5;
    sd::InpaintBlend wrong{at::ones({1, 2, 2, 2})};
    EXPECT_THROW(record(s, &wrong), sd::Error);
    c10::InferenceMode guard;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
    sd::ModelFn model = [](const at::Tensor& x, const at::Tensor&) { return at::zeros_like(x); };
    EXPECT_THROW(sd::sample(s, model, at::zeros({1, 4, 2, 2}), tiny_alphas(), gen, nullptr, at::zeros({1, 4, 3, 3})), sd::Error);
}
