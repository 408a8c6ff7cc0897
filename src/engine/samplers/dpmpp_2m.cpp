// DPM++ 2M: k-diffusion's sample_dpmpp_2m, and diffusers'
// DPMSolverMultistepScheduler for --schedule leading and Karras img2img.
#include <tuple>

#include "core/schedule.h"
#include "engine/samplers/k_diffusion.h"

namespace sd {

namespace {

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

// The model's sigmas at the given timesteps, then 0.
at::Tensor sigmas_at(const std::vector<float>& ac, const std::vector<int>& ts) {
    auto s = model_sigmas(ac).index_select(0, at::tensor(std::vector<int64_t>(ts.begin(), ts.end()), at::kLong));
    return at::cat({s, at::zeros({1}, at::kFloat)});
}

}  // namespace

// --schedule leading, and karras with init latents, are diffusers'
// DPMSolverMultistepScheduler (init_noise_sigma 1); default, and karras for
// txt2img, k-diffusion's sample_dpmpp_2m.
at::Tensor sample_dpmpp_2m(const SamplerRun& r) {
    const bool leading = r.s.schedule == "leading";
    if (!leading && !(r.s.schedule == "karras" && r.img2img())) {
        KRun k = k_run(r, true);
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

}  // namespace sd
