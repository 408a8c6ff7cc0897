#include "engine/sampling_loop.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/img2img_schedule.h"
#include "core/sampler_list.h"
#include "core/schedule.h"
#include "sd/error.h"
#include "sd/sampler_catalog.h"

namespace sd {

namespace {

// ---------------------------------------------------------------- CompVis PLMS / DDIM

// Per-step constants, as ldm's make_ddim_sampling_parameters builds them:
// alphas = alphas_cumprod[t], alphas_prev = [alphas_cumprod[0]] + alphas[:-1],
// sqrt_one_minus_alphas = sqrt(1 - alphas) in float32; sigmas are 0 (eta = 0).
struct StepTable {
    std::vector<int> timesteps;  // ascending
    std::vector<float> alphas, alphas_prev, sqrt_one_minus_alphas;
};

StepTable make_table(const std::vector<float>& ac, int steps, const std::string& spacing) {
    StepTable s;
    s.timesteps = compvis_timesteps(steps, static_cast<int>(ac.size()), spacing);
    for (size_t i = 0; i < s.timesteps.size(); ++i) {
        float a = ac.at(static_cast<size_t>(s.timesteps[i]));
        s.alphas.push_back(a);
        s.alphas_prev.push_back(i == 0 ? ac[0] : ac[static_cast<size_t>(s.timesteps[i - 1])]);
        s.sqrt_one_minus_alphas.push_back(std::sqrt(1.0f - a));
    }
    return s;
}

// ldm's get_x_prev_and_pred_x0 with sigma_t = 0; draws (and discards, since it
// is multiplied by sigma_t = 0) the noise tensor the reference draws, unless
// draw is false (diffusers' DDIMScheduler with eta 0). A v model's DDIM passes
// its own pred_x0 (ddim.py computes it from v directly).
std::pair<at::Tensor, at::Tensor> ddim_update(const at::Tensor& x, const at::Tensor& e_t, const StepTable& s,
                                              int64_t index, StepNoise& draws, at::Tensor pred_x0 = {},
                                              bool draw = true) {
    const int64_t b = x.size(0);
    auto opts = x.options();
    auto a_t = at::full({b, 1, 1, 1}, s.alphas[index], opts);
    auto a_prev = at::full({b, 1, 1, 1}, s.alphas_prev[index], opts);
    auto sqrt_one_minus_at = at::full({b, 1, 1, 1}, s.sqrt_one_minus_alphas[index], opts);
    if (!pred_x0.defined()) pred_x0 = (x - sqrt_one_minus_at * e_t) / a_t.sqrt();
    auto dir_xt = (1.0 - a_prev).sqrt() * e_t;
    if (draw) draws.next(x);
    auto x_prev = a_prev.sqrt() * pred_x0 + dir_xt;
    return {x_prev, pred_x0};
}

at::Tensor timestep_tensor(int64_t b, int t) { return at::full({b}, static_cast<int64_t>(t), at::kLong); }

// sqrt(a_t) and sqrt(1 - a_t) as ldm's float32 buffers sqrt_alphas_cumprod and
// sqrt_one_minus_alphas_cumprod (square roots taken in double precision).
std::pair<float, float> v_coefficients(const std::vector<float>& ac, const at::Tensor& t) {
    const double a = ac.at(static_cast<size_t>(t[0].item<int64_t>()));
    return {static_cast<float>(std::sqrt(a)), static_cast<float>(std::sqrt(1.0 - a))};
}

// eps from a v model's output at (x, t): predict_eps_from_z_and_v of ddpm.py.
EpsFn v_to_eps(const ModelFn& model, const std::vector<float>& ac) {
    return [&model, &ac](const at::Tensor& x, const at::Tensor& t) {
        auto [sa, s1a] = v_coefficients(ac, t);
        return sa * model(x, t) + s1a * x;
    };
}

// Called after step `i` of `total` (the steps of this run) with x; returns
// the x the next step starts from (inpainting's blend), or x itself.
using AfterStep = std::function<at::Tensor(int i, int total, at::Tensor x)>;

// DDIM from entry `first` of the ascending table down to entry 0 (txt2img:
// the top entry). CompVis draws a (discarded) noise tensor in every step,
// diffusers' DDIMScheduler with eta 0 none.
at::Tensor run_ddim(const ModelFn& model, Parameterization p, at::Tensor x, const std::vector<float>& ac,
                    const StepTable& s, int first, bool draw, StepNoise& draws, const AfterStep& after,
                    const StepFn& on_step) {
    const int total = first + 1;
    for (int i = 0; i < total; ++i) {
        const int64_t index = first - i;
        auto t = timestep_tensor(x.size(0), s.timesteps[index]);
        auto out = model(x, t);
        at::Tensor e_t = out, pred_x0;
        if (p == Parameterization::V) {
            auto [sa, s1a] = v_coefficients(ac, t);
            e_t = sa * out + s1a * x;
            pred_x0 = sa * x - s1a * out;
        }
        auto [x_prev, x0] = ddim_update(x, e_t, s, index, draws, pred_x0, draw);
        x = x_prev;
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, x0);
    }
    return x;
}

at::Tensor run_plms(const EpsFn& eps, at::Tensor x, const std::vector<float>& ac, int steps, const std::string& spacing,
                    StepNoise& draws, const StepFn& on_step) {
    const StepTable s = make_table(ac, steps, spacing);
    const int total = static_cast<int>(s.timesteps.size());
    std::vector<at::Tensor> old_eps;  // guided eps of earlier steps, newest last
    for (int i = 0; i < total; ++i) {
        const int64_t index = total - i - 1;
        const int64_t b = x.size(0);
        auto e_t = eps(x, timestep_tensor(b, s.timesteps[index]));
        at::Tensor e_prime;
        const size_t n = old_eps.size();
        if (n == 0) {
            // Pseudo improved Euler: a trial step, the model again at its end
            // (at the next timestep), then the mean of both slopes.
            auto trial = ddim_update(x, e_t, s, index, draws);
            auto e_next = eps(trial.first, timestep_tensor(b, s.timesteps[std::max<int64_t>(index - 1, 0)]));
            e_prime = (e_t + e_next) / 2;
        } else if (n == 1) {
            e_prime = (3 * e_t - old_eps[0]) / 2;
        } else if (n == 2) {
            e_prime = (23 * e_t - 16 * old_eps[1] + 5 * old_eps[0]) / 12;
        } else {
            e_prime = (55 * e_t - 59 * old_eps[n - 1] + 37 * old_eps[n - 2] - 9 * old_eps[n - 3]) / 24;
        }
        auto [x_prev, pred_x0] = ddim_update(x, e_prime, s, index, draws);
        x = x_prev;
        old_eps.push_back(e_t);
        if (old_eps.size() > 3) old_eps.erase(old_eps.begin());
        if (on_step) on_step(i, total, x, pred_x0);
    }
    return x;
}

// ---------------------------------------------------------------- k-diffusion

// Sigmas are 0-dim float32 tensors and every formula is written with the
// reference's tensor ops, so that the float32 rounding is the reference's.
// CompVisDenoiser (eps) / CompVisVDenoiser (v) around the guided model:
// D(x, sigma, step) with c_in = 1 / sqrt(sigma^2 + 1) and the continuous
// timestep. With step_t (--schedule trailing) it is diffusers' Euler
// schedulers instead: x / sqrt(sigma^2 + 1) and the step's own timestep.
// Whose sampler code a k-sampler follows: k-diffusion's (continuous timesteps),
// diffusers' (--schedule trailing) or sgm's (SDXL).
enum class Flavour { KDiffusion, Diffusers, Sgm };

struct Denoiser {
    const ModelFn& model;
    Parameterization p;
    at::Tensor log_sigmas;
    std::vector<int> step_t;  // diffusers, sgm: each step's timestep; empty: k-diffusion's sigma_to_t
    Flavour flavour = Flavour::KDiffusion;

    at::Tensor operator()(const at::Tensor& x, const at::Tensor& sigma, int step) const {
        const int64_t b = x.size(0);
        auto s = sigma * at::ones({b}, at::kFloat);  // sigmas[i] * s_in
        auto s4 = s.view({b, 1, 1, 1});
        auto sum = at::pow(s4, 2) + 1.0;  // sigma^2 + sigma_data^2
        at::Tensor out;
        if (flavour == Flavour::KDiffusion) {
            auto c_in = 1.0 / at::pow(sum, 0.5);
            out = model(x * c_in, sigma_to_t(s, log_sigmas));
        } else if (flavour == Flavour::Sgm) {  // EpsScaling's c_in and the sigma's index in the table
            auto c_in = 1.0 / at::pow(sum, 0.5);
            out = model(x * c_in, at::full({b}, static_cast<int64_t>(step_t.at(static_cast<size_t>(step))), at::kLong));
        } else {  // scale_model_input, and the float timestep diffusers passes
            out = model(x / at::pow(sum, 0.5),
                        at::full({b}, static_cast<float>(step_t.at(static_cast<size_t>(step))), at::kFloat));
        }
        if (p == Parameterization::Eps) return x + out * (-s4);  // c_out = -sigma
        auto c_skip = 1.0 / sum;
        auto c_out = -s4 * 1.0 / at::pow(sum, 0.5);
        return x * c_skip + out * c_out;
    }
};

at::Tensor to_d(const at::Tensor& x, const at::Tensor& sigma, const at::Tensor& denoised) {
    return (x - denoised) / sigma;
}

at::Tensor run_euler(const Denoiser& D, at::Tensor x, const at::Tensor& sigmas, StepNoise& draws,
                     const AfterStep& after, const StepFn& on_step) {
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        // k-diffusion draws it even with s_churn = 0; sgm's EulerEDMSampler does not.
        if (D.flavour != Flavour::Sgm) draws.next(x);
        auto sigma = sigmas[i] * 1.0;  // sigma_hat = sigma * (gamma + 1), gamma = 0
        auto denoised = D(x, sigma, i);
        auto d = to_d(x, sigma, denoised);
        x = x + d * (sigmas[i + 1] - sigma);
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

// k-diffusion's sample_euler_ancestral; diffusers' EulerAncestralDiscreteScheduler
// step draws its noise in every step (the last one's multiplied by sigma_up = 0)
// and does not clamp sigma_up; sgm's EulerAncestralSampler clamps it and draws
// in every step, the last one's discarded.
at::Tensor run_euler_ancestral(const Denoiser& D, at::Tensor x, const at::Tensor& sigmas, StepNoise& draws,
                               const AfterStep& after, const StepFn& on_step) {
    const bool diffusers = D.flavour == Flavour::Diffusers, sgm = D.flavour == Flavour::Sgm;
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto from = sigmas[i], to = sigmas[i + 1];
        auto denoised = D(x, from, i);
        // get_ancestral_step with eta = 1
        auto up = at::pow(at::pow(to, 2) * (at::pow(from, 2) - at::pow(to, 2)) / at::pow(from, 2), 0.5);
        if (!diffusers && to.item<float>() < up.item<float>()) up = to;
        auto down = at::pow(at::pow(to, 2) - at::pow(up, 2), 0.5);
        auto d = to_d(x, from, denoised);
        x = x + d * (down - from);
        if (sgm) {
            auto noise = draws.next(x);
            if (to.item<float>() > 0) x = x + noise * 1.0 * up;
        } else if (diffusers || to.item<float>() > 0) {
            x = x + draws.next(x) * 1.0 * up;
        }
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

at::Tensor run_dpmpp_2m(const Denoiser& D, at::Tensor x, const at::Tensor& sigmas, const AfterStep& after,
                        const StepFn& on_step) {
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    auto t_of = [](const at::Tensor& sigma) { return sigma.log().neg(); };
    auto sigma_of = [](const at::Tensor& t) { return t.neg().exp(); };
    at::Tensor old_denoised;
    for (int i = 0; i < total; ++i) {
        auto denoised = D(x, sigmas[i], i);
        auto t = t_of(sigmas[i]), t_next = t_of(sigmas[i + 1]);
        auto h = t_next - t;
        auto ratio = sigma_of(t_next) / sigma_of(t);
        if (!old_denoised.defined() || sigmas[i + 1].item<float>() == 0) {
            x = ratio * x - (-h).expm1() * denoised;
        } else {
            auto h_last = t - t_of(sigmas[i - 1]);
            auto r = h_last / h;
            auto denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised;
            x = ratio * x - (-h).expm1() * denoised_d;
        }
        old_denoised = denoised;
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

// ---------------------------------------------------------------- LCM

// diffusers' LCMScheduler: x_T is the start noise (init sigma 1), the UNet gets
// x and the integer t; each step's denoised = c_out pred_x0 + c_skip x is
// noised again to the next timestep of the list with a fresh draw, except in
// the last step, whose denoised is the result. img2img starts at entry `first`.
at::Tensor run_lcm(const ModelFn& model, Parameterization p, at::Tensor x, const std::vector<float>& ac,
                   const std::vector<int>& ts, int first, StepNoise& draws, const AfterStep& after,
                   const StepFn& on_step) {
    const int count = static_cast<int>(ts.size()), total = count - first;
    for (int i = 0; i < total; ++i) {
        const size_t k = static_cast<size_t>(first + i);
        const int t = ts[k];
        auto out = model(x, timestep_tensor(x.size(0), t));
        auto a_t = at::scalar_tensor(ac.at(static_cast<size_t>(t)), at::kFloat);
        auto b_t = 1 - a_t;
        auto pred_x0 =
            p == Parameterization::Eps ? (x - b_t.sqrt() * out) / a_t.sqrt() : a_t.sqrt() * x - b_t.sqrt() * out;
        auto [c_skip, c_out] = lcm_scalings(t);
        auto denoised = c_out * pred_x0 + c_skip * x;
        if (i + 1 < total) {
            auto a_prev = at::scalar_tensor(ac.at(static_cast<size_t>(ts[k + 1])), at::kFloat);
            auto noise = draws.next(x);
            x = a_prev.sqrt() * denoised + (1 - a_prev).sqrt() * noise;
        } else {
            x = denoised;
        }
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

// ---------------------------------------------------------------- diffusers' DPM++ 2M

// DPMSolverMultistepScheduler's _sigma_to_alpha_sigma_t: the VP pair (alpha, alpha sigma).
std::pair<at::Tensor, at::Tensor> vp_alpha_sigma(const at::Tensor& sigma) {
    auto alpha = 1 / at::pow(at::pow(sigma, 2) + 1, 0.5);
    return {alpha, sigma * alpha};
}

// diffusers' DPMSolverMultistepScheduler (dpmsolver++, order 2, midpoint,
// lower_order_final, final_sigmas_type "zero") from entry `first` of its
// sigmas (steps + 1, last 0) and integer timesteps: x is the VP sample, the
// UNet gets x and the timestep unscaled; the first step run and the last one
// are first order. Draws nothing.
at::Tensor run_dpm_solver(const ModelFn& model, Parameterization p, at::Tensor x, const at::Tensor& sigmas,
                          const std::vector<int>& ts, int first, const AfterStep& after, const StepFn& on_step) {
    const int count = static_cast<int>(ts.size()), total = count - first;
    auto lambda = [](const at::Tensor& alpha, const at::Tensor& sigma) { return at::log(alpha) - at::log(sigma); };
    at::Tensor prev_x0;
    for (int i = 0; i < total; ++i) {
        const int k = first + i;
        auto out = model(x, timestep_tensor(x.size(0), ts[static_cast<size_t>(k)]));
        auto [alpha_s0, sigma_s0] = vp_alpha_sigma(sigmas[k]);
        auto x0 = p == Parameterization::Eps ? (x - sigma_s0 * out) / alpha_s0 : alpha_s0 * x - sigma_s0 * out;
        auto [alpha_t, sigma_t] = vp_alpha_sigma(sigmas[k + 1]);
        auto h = lambda(alpha_t, sigma_t) - lambda(alpha_s0, sigma_s0);
        auto phi = alpha_t * (at::exp(-h) - 1.0);
        if (!prev_x0.defined() || k == count - 1) {
            x = (sigma_t / sigma_s0) * x - phi * x0;
        } else {
            auto [alpha_s1, sigma_s1] = vp_alpha_sigma(sigmas[k - 1]);
            auto r0 = (lambda(alpha_s0, sigma_s0) - lambda(alpha_s1, sigma_s1)) / h;
            auto d1 = (1.0 / r0) * (x0 - prev_x0);
            x = (sigma_t / sigma_s0) * x - phi * x0 - 0.5 * phi * d1;
        }
        prev_x0 = x0;
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, x0);
    }
    return x;
}

// One run's inputs, the same for every sampler function.
struct SamplerRun {
    const SamplerSettings& s;
    const ModelFn& model;
    at::Tensor noise;
    const std::vector<float>& ac;
    StepNoise& draws;
    const StepFn& on_step;
    at::Tensor x0;    // img2img / inpainting: the init latents, noise's size; undefined: txt2img
    at::Tensor mask;  // inpainting's latent blend; undefined: none

    bool img2img() const { return x0.defined(); }
    // txt2img, and the blend at strength 1.0 (diffusers' is_strength_max),
    // start from the noise alone (times the schedule's initial sigma).
    bool from_noise() const { return !x0.defined() || (mask.defined() && s.strength == 1.0); }
};

// The inpainting blend (InpaintBlend) after step i of total: noised_after(i)
// gives the init latents at the level x has after step i.
AfterStep blend_after(const SamplerRun& r, std::function<at::Tensor(int i)> noised_after) {
    if (!r.mask.defined()) return nullptr;
    return [&r, noised_after = std::move(noised_after)](int i, int total, at::Tensor x) {
        at::Tensor proper = i + 1 < total ? noised_after(i) : r.x0;
        return (1 - r.mask) * proper + r.mask * x;
    };
}

// DDIMScheduler's and LCMScheduler's add_noise at alphas_cumprod value a (float32).
at::Tensor vp_noised(const at::Tensor& x0, const at::Tensor& noise, float a) {
    return std::sqrt(a) * x0 + std::sqrt(1.0f - a) * noise;
}

// A k-sampler's run: its sigmas from the first step run on (last 0), the
// denoiser, the x it starts from and the blend.
struct KRun {
    at::Tensor sigmas;
    Denoiser denoiser;
    at::Tensor x;
    AfterStep after;
};

// The start of txt2img is noise times the schedule's initial sigma:
// k-diffusion's sigmas[0]; diffusers' init_noise_sigma, sqrt(sigma_max^2 + 1)
// for leading and sigma_max (= sigmas[0]) for trailing; sgm's sqrt(1 +
// sigma_0^2) (prepare_sampling_loop). img2img starts at entry t_start of the
// sigmas with x0 + sigma noise, as diffusers' Euler schedulers' add_noise.
KRun k_run(const SamplerRun& r) {
    const int T = static_cast<int>(r.ac.size());
    at::Tensor sigmas, init_sigma;
    Denoiser d{r.model, r.s.parameterization, {}, {}, Flavour::KDiffusion};
    if (r.s.sgm && r.s.schedule == "default") {
        sigmas = sgm_sigmas(r.s.steps, r.ac, r.s.linear_start, r.s.linear_end);
        init_sigma = at::sqrt(1.0 + at::pow(sigmas[0], 2.0));
        d.step_t = sgm_timesteps(r.s.steps, T);
        d.flavour = Flavour::Sgm;
    } else {
        sigmas = k_sigmas(r.s.schedule, r.s.steps, r.ac);
        init_sigma = sigmas[0];
        if (r.s.schedule == "leading") {
            init_sigma = at::pow(at::pow(sigmas.max(), 2) + 1, 0.5);
            d.step_t = compvis_timesteps(r.s.steps, T, "leading");
            std::reverse(d.step_t.begin(), d.step_t.end());
            d.flavour = Flavour::Diffusers;
        } else if (r.s.schedule == "trailing") {
            d.step_t = trailing_timesteps(r.s.steps, T);
            d.flavour = Flavour::Diffusers;
        } else {
            d.log_sigmas = model_sigmas(r.ac).log();
        }
    }
    if (!r.img2img()) return {sigmas, std::move(d), r.noise * init_sigma, nullptr};
    // strength * steps < 1: t_start = steps, sigmas = [0], no step runs and x = x0.
    const int t_start = diffusers_t_start(r.s.strength, static_cast<int>(sigmas.size(0)) - 1);
    sigmas = sigmas.slice(0, t_start);
    if (!d.step_t.empty()) d.step_t.erase(d.step_t.begin(), d.step_t.begin() + t_start);
    auto noised = [&r, sigmas](int j) { return r.x0 + r.noise * sigmas[j]; };
    at::Tensor x = r.from_noise() ? r.noise * init_sigma : noised(0);
    return {sigmas, std::move(d), std::move(x), blend_after(r, [noised](int i) { return noised(i + 1); })};
}

// The model's sigmas at the given timesteps, then 0.
at::Tensor sigmas_at(const std::vector<float>& ac, const std::vector<int>& ts) {
    auto s = model_sigmas(ac).index_select(0, at::tensor(std::vector<int64_t>(ts.begin(), ts.end()), at::kLong));
    return at::cat({s, at::zeros({1}, at::kFloat)});
}

// One function per row of core/sampler_list.h.
at::Tensor sample_plms(const SamplerRun& r) {
    const bool v = r.s.parameterization == Parameterization::V;
    return run_plms(v ? v_to_eps(r.model, r.ac) : r.model, r.noise, r.ac, r.s.steps, r.s.schedule, r.draws, r.on_step);
}

at::Tensor sample_ddim(const SamplerRun& r) {
    const StepTable table = make_table(r.ac, r.s.steps, r.s.schedule);
    const int count = static_cast<int>(table.timesteps.size());
    const Parameterization p = r.s.parameterization;
    if (!r.img2img()) return run_ddim(r.model, p, r.noise, r.ac, table, count - 1, true, r.draws, nullptr, r.on_step);
    // Entries of the ascending table: the one x is noised to and the first step run.
    int level = 0, first = 0;
    const bool compvis = r.s.schedule == "default";
    if (compvis) {
        const int t_enc = compvis_t_enc(r.s.strength, r.s.steps);
        // img2img.py fails with an index error when t_enc is past the table
        // (strength 1.0 with exactly `steps` entries). A user asking for full
        // strength expects the whole schedule: x is noised to the top entry
        // and every step runs from there (as diffusers does at strength 1.0).
        if (t_enc >= count) {
            level = first = count - 1;
        } else {
            level = t_enc;  // and t_enc = 0 runs no step: the noised latents are the result
            first = t_enc - 1;
        }
    } else {
        const int t_start = diffusers_t_start(r.s.strength, count);
        if (t_start == count) return r.x0;  // strength * steps < 1: no step runs
        level = first = count - 1 - t_start;
    }
    auto noised = [&](int j) { return vp_noised(r.x0, r.noise, table.alphas[static_cast<size_t>(j)]); };
    at::Tensor x = r.from_noise() ? r.noise : noised(level);
    return run_ddim(r.model, p, x, r.ac, table, first, compvis, r.draws,
                    blend_after(r, [&](int i) { return noised(first - i - 1); }), r.on_step);
}

at::Tensor sample_euler(const SamplerRun& r) {
    KRun k = k_run(r);
    return run_euler(k.denoiser, std::move(k.x), k.sigmas, r.draws, k.after, r.on_step);
}

at::Tensor sample_euler_a(const SamplerRun& r) {
    KRun k = k_run(r);
    return run_euler_ancestral(k.denoiser, std::move(k.x), k.sigmas, r.draws, k.after, r.on_step);
}

// --schedule leading, and karras with init latents, are diffusers'
// DPMSolverMultistepScheduler (init_noise_sigma 1); default, and karras for
// txt2img, k-diffusion's sample_dpmpp_2m.
at::Tensor sample_dpmpp_2m(const SamplerRun& r) {
    const bool leading = r.s.schedule == "leading";
    if (!leading && !(r.s.schedule == "karras" && r.img2img())) {
        KRun k = k_run(r);
        return run_dpmpp_2m(k.denoiser, std::move(k.x), k.sigmas, k.after, r.on_step);
    }
    at::Tensor sigmas;
    std::vector<int> ts;
    if (leading) {
        ts = dpm_leading_timesteps(r.s.steps, static_cast<int>(r.ac.size()));
        sigmas = sigmas_at(r.ac, ts);
    } else {
        std::tie(sigmas, ts) = dpm_karras_schedule(r.s.steps, r.ac);
    }
    const Parameterization p = r.s.parameterization;
    if (!r.img2img()) return run_dpm_solver(r.model, p, r.noise, sigmas, ts, 0, nullptr, r.on_step);
    const int count = static_cast<int>(ts.size());
    const int t_start = diffusers_t_start(r.s.strength, count);
    if (t_start == count) return r.x0;
    auto noised = [&](int k) {
        auto [alpha, sigma] = vp_alpha_sigma(sigmas[k]);
        return alpha * r.x0 + sigma * r.noise;
    };
    at::Tensor x = r.from_noise() ? r.noise : noised(t_start);
    return run_dpm_solver(r.model, p, x, sigmas, ts, t_start,
                          blend_after(r, [&](int i) { return noised(t_start + i + 1); }), r.on_step);
}

at::Tensor sample_lcm(const SamplerRun& r) {
    const std::vector<int> ts = lcm_timesteps(r.s.steps, static_cast<int>(r.ac.size()));
    const Parameterization p = r.s.parameterization;
    if (!r.img2img()) return run_lcm(r.model, p, r.noise, r.ac, ts, 0, r.draws, nullptr, r.on_step);
    const int count = static_cast<int>(ts.size());
    const int t_start = diffusers_t_start(r.s.strength, count);
    if (t_start == count) return r.x0;
    auto noised = [&](int k) {
        return vp_noised(r.x0, r.noise, r.ac.at(static_cast<size_t>(ts[static_cast<size_t>(k)])));
    };
    at::Tensor x = r.from_noise() ? r.noise : noised(t_start);
    return run_lcm(r.model, p, x, r.ac, ts, t_start, r.draws,
                   blend_after(r, [&](int i) { return noised(t_start + i + 1); }), r.on_step);
}

}  // namespace

// ---------------------------------------------------------------- public

Parameterization parse_parameterization(const std::string& name) {
    if (name == "eps") return Parameterization::Eps;
    if (name == "v") return Parameterization::V;
    throw Error("unknown parameterization '" + name + "' in model.json (expected eps or v)");
}

at::Tensor model_sigmas(const std::vector<float>& ac) {
    auto a = at::tensor(ac, at::kFloat);
    return at::pow((1 - a) / a, 0.5);
}

at::Tensor k_sigmas(const std::string& schedule, int steps, const std::vector<float>& ac) {
    if (steps < 1) throw Error("steps must be at least 1, got " + std::to_string(steps));
    auto sigmas = model_sigmas(ac);
    const int64_t T = sigmas.size(0);
    at::Tensor s;
    if (schedule == "default") {
        // get_sigmas: t_to_sigma(linspace(T - 1, 0, steps))
        auto t = at::linspace(static_cast<double>(T - 1), 0.0, steps, at::kFloat);
        auto low = t.floor().to(at::kLong), high = t.ceil().to(at::kLong);
        auto w = t.frac();
        auto log_sigmas = sigmas.log();
        s = ((1 - w) * log_sigmas.index_select(0, low) + w * log_sigmas.index_select(0, high)).exp();
    } else if (schedule == "karras") {
        const double rho = 7.0;
        const double min_inv_rho = std::pow(static_cast<double>(sigmas[0].item<float>()), 1 / rho);
        const double max_inv_rho = std::pow(static_cast<double>(sigmas[T - 1].item<float>()), 1 / rho);
        auto ramp = at::linspace(0.0, 1.0, steps, at::kFloat);
        s = at::pow(ramp * (min_inv_rho - max_inv_rho) + max_inv_rho, rho);
    } else if (schedule == "trailing" || schedule == "leading") {
        // diffusers' Euler schedulers: the model's sigmas at the timesteps
        // (np.interp at whole timesteps is the table's value).
        auto ts = schedule == "trailing" ? trailing_timesteps(steps, static_cast<int>(T))
                                         : compvis_timesteps(steps, static_cast<int>(T), "leading");
        if (schedule == "leading") std::reverse(ts.begin(), ts.end());
        s = sigmas.index_select(0, at::tensor(std::vector<int64_t>(ts.begin(), ts.end()), at::kLong));
    } else {
        throw Error("unknown schedule '" + schedule + "' (choose default, karras, leading or trailing)");
    }
    return at::cat({s, at::zeros({1}, at::kFloat)});
}

at::Tensor sgm_sigmas(int steps, const std::vector<float>& ac32, double linear_start, double linear_end) {
    const int64_t T = static_cast<int64_t>(ac32.size());
    at::Tensor ac;
    if (linear_start > 0) {
        // make_beta_schedule("linear"): torch.linspace of the square roots in
        // float64, squared; alphas_cumprod = np.cumprod(1 - betas).
        auto betas = at::pow(at::linspace(std::sqrt(linear_start), std::sqrt(linear_end), T, at::kDouble), 2);
        ac = at::cumprod(1.0 - betas, 0);
    } else {
        ac = at::tensor(ac32, at::kFloat).to(at::kDouble);
    }
    const auto ts = sgm_timesteps(steps, static_cast<int>(T));
    ac = ac.index_select(0, at::tensor(std::vector<int64_t>(ts.begin(), ts.end()), at::kLong));
    // (1 - a) / a in float64, made float32, then the square root in float32.
    auto s = at::pow(((1.0 - ac) / ac).to(at::kFloat), 0.5);
    return at::cat({s, at::zeros({1}, at::kFloat)});
}

std::pair<at::Tensor, std::vector<int>> dpm_karras_schedule(int steps, const std::vector<float>& ac) {
    if (steps < 1) throw Error("steps must be at least 1, got " + std::to_string(steps));
    // The float32 table and its float32 logs, as numpy holds them.
    const at::Tensor table = model_sigmas(ac), log_table = table.log();
    const int64_t T = table.size(0);
    const float* sig = table.data_ptr<float>();
    const float* log_sig = log_table.data_ptr<float>();
    const double rho = 7.0;
    const double min_inv_rho = std::pow(static_cast<double>(sig[0]), 1 / rho);
    const double max_inv_rho = std::pow(static_cast<double>(sig[T - 1]), 1 / rho);
    std::vector<float> sigmas;
    std::vector<int> ts;
    for (int i = 0; i < steps; ++i) {
        // np.linspace(0, 1, steps): i * (1 / (steps - 1)), the last exactly 1.
        const double ramp = steps == 1 ? 0.0 : i == steps - 1 ? 1.0 : i * (1.0 / (steps - 1));
        const double sigma = std::pow(max_inv_rho + ramp * (min_inv_rho - max_inv_rho), rho);
        // _sigma_to_t: interpolate log sigma between the table's neighbours
        // (the last entry whose log is <= it, at most T - 2), then round.
        const double log_sigma = std::log(std::max(sigma, 1e-10));
        int64_t low = 0;
        for (int64_t k = 0; k < T; ++k)
            if (log_sigma - log_sig[k] >= 0) low = k;
        low = std::min<int64_t>(low, T - 2);
        const double w =
            std::clamp((log_sig[low] - log_sigma) / static_cast<double>(log_sig[low] - log_sig[low + 1]), 0.0, 1.0);
        ts.push_back(
            static_cast<int>(std::nearbyint((1 - w) * static_cast<double>(low) + w * static_cast<double>(low + 1))));
        sigmas.push_back(static_cast<float>(sigma));
    }
    sigmas.push_back(0.0f);
    return {at::tensor(sigmas, at::kFloat), ts};
}

// LCMScheduler's boundary-condition scalings at integer timestep t
// (timestep_scaling 10, sigma_data 0.5), as its float32 tensor ops round them.
std::pair<at::Tensor, at::Tensor> lcm_scalings(int t) {
    auto scaled = at::scalar_tensor(static_cast<double>(t), at::kFloat) * 10.0;
    auto den = at::pow(scaled, 2) + 0.25;
    auto c_skip = at::reciprocal(den) * 0.25;  // python's 0.25 / tensor
    auto c_out = scaled / at::pow(den, 0.5);
    return {c_skip, c_out};
}

at::Tensor sigma_to_t(const at::Tensor& sigma, const at::Tensor& log_sigmas) {
    auto flat = sigma.reshape({-1});
    auto log_sigma = flat.log();
    auto dists = log_sigma - log_sigmas.unsqueeze(1);  // [T, n]
    // Last index whose log sigma is <= log_sigma (0 below the table), at most T - 2.
    auto low_idx = dists.ge(0).cumsum(0).argmax(0).clamp_max(log_sigmas.size(0) - 2);
    auto high_idx = low_idx + 1;
    auto low = log_sigmas.index_select(0, low_idx), high = log_sigmas.index_select(0, high_idx);
    auto w = ((low - log_sigma) / (low - high)).clamp(0, 1);
    auto t = (1 - w) * low_idx + w * high_idx;
    return t.view(sigma.sizes());
}

at::Tensor sample(const SamplerSettings& s, const ModelFn& model, at::Tensor noise, const std::vector<float>& ac,
                  StepNoise& draws, const StepFn& on_step, const at::Tensor& init_latents, const InpaintBlend* blend) {
    check_sampler_settings(s.sampler, s.schedule);
    using Fn = at::Tensor (*)(const SamplerRun&);
#define SD_SAMPLER_FN(function, name, a1111, family, schedules) {name, &sample_##function},
    static const std::pair<const char*, Fn> functions[] = {SD_SAMPLERS(SD_SAMPLER_FN)};
#undef SD_SAMPLER_FN
    SamplerRun run{s, model, std::move(noise), ac, draws, on_step, {}, {}};
    if (blend && !init_latents.defined()) throw Error("inpainting's latent blend needs the image latents");
    if (init_latents.defined()) {
        img2img_step_count(s.sampler, s.schedule, s.steps, s.strength,
                           static_cast<int>(ac.size()));  // refuses what cannot run
        // [1 or n, C, h, w] against noise's [n, C, h, w]
        auto fits = [&](const at::Tensor& t, int64_t channels) {
            const auto& n = run.noise;
            return t.dim() == 4 && (t.size(0) == 1 || t.size(0) == n.size(0)) && t.size(1) == channels &&
                   t.size(2) == n.size(2) && t.size(3) == n.size(3);
        };
        if (!fits(init_latents, run.noise.size(1)))
            throw Error("the init latents' shape " + std::string(c10::str(init_latents.sizes())) +
                        " does not fit the noise's " + std::string(c10::str(run.noise.sizes())));
        run.x0 = init_latents.to(at::kFloat).expand(run.noise.sizes()).contiguous();
        if (blend) {
            if (!blend->mask.defined() || !fits(blend->mask, 1))
                throw Error("the inpainting mask must be [1 or n, 1, h, w] at the latents' size");
            run.mask = blend->mask.to(at::kFloat);
        }
    }
    for (const auto& [name, fn] : functions)
        if (s.sampler == name) return fn(run);
    throw Error("unknown sampler '" + s.sampler + "'");  // check_sampler_settings refused it already
}

at::Tensor sample(const SamplerSettings& s, const ModelFn& model, at::Tensor noise, const std::vector<float>& ac,
                  at::Generator& gen, const StepFn& on_step, const at::Tensor& init_latents,
                  const InpaintBlend* blend) {
    GeneratorNoise draws(gen);
    return sample(s, model, std::move(noise), ac, draws, on_step, init_latents, blend);
}

}  // namespace sd
