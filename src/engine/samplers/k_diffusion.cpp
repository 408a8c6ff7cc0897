#include "engine/samplers/k_diffusion.h"

#include <algorithm>

#include "core/schedule.h"
#include "sd/sampler_catalog.h"

namespace sd {

at::Tensor Denoiser::operator()(const at::Tensor& x, const at::Tensor& sigma, int step) const {
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

at::Tensor to_d(const at::Tensor& x, const at::Tensor& sigma, const at::Tensor& denoised) {
    return (x - denoised) / sigma;
}

AncestralStep ancestral_step(const at::Tensor& from, const at::Tensor& to, double eta) {
    if (eta == 0) return {to, at::zeros_like(to)};
    auto up = eta * at::pow(at::pow(to, 2) * (at::pow(from, 2) - at::pow(to, 2)) / at::pow(from, 2), 0.5);
    if (!(up.item<float>() < to.item<float>())) up = to;  // Python's min(to, up)
    auto down = at::pow(at::pow(to, 2) - at::pow(up, 2), 0.5);
    return {down, up};
}

double run_eta(const SamplerSettings& s) { return s.eta.value_or(1.0); }

at::Tensor sampler_sigmas(const SamplerSettings& s, const std::vector<float>& ac) {
    const KScheduleOptions o{s.sgm, s.beta_alpha, s.beta_beta};
    if (!sampler_info(s.sampler).has("discard_penultimate")) return k_sigmas(s.schedule, s.steps, ac, o);
    const at::Tensor longer = k_sigmas(s.schedule, s.steps + 1, ac, o);
    return at::cat({longer.slice(0, 0, -2), longer.slice(0, -1)});
}

KRun k_run(const SamplerRun& r, bool sgm_flavour) {
    const int T = static_cast<int>(r.ac.size());
    at::Tensor sigmas, init_sigma;
    Denoiser d{r.model, r.s.parameterization, {}, {}, Flavour::KDiffusion};
    if (sgm_flavour && r.s.sgm && r.s.schedule == "default") {
        sigmas = sgm_sigmas(r.s.steps, r.ac, r.s.linear_start, r.s.linear_end);
        init_sigma = at::sqrt(1.0 + at::pow(sigmas[0], 2.0));
        d.step_t = sgm_timesteps(r.s.steps, T);
        d.flavour = Flavour::Sgm;
    } else {
        sigmas = sampler_sigmas(r.s, r.ac);
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

}  // namespace sd
