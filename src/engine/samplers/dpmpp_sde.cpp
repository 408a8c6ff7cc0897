// k-diffusion's sample_dpmpp_sde (r = 1/2): two DPM-Solver++ half steps, each
// with ancestral noise from the Brownian trees (noise_sampler.h); Euler's for
// the step to 0.
#include "engine/samplers/k_diffusion.h"
#include "engine/samplers/noise_sampler.h"

namespace sd {

at::Tensor sample_dpmpp_sde(const SamplerRun& r) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    at::Tensor x = std::move(k.x);
    const std::unique_ptr<NoiseSampler> noise = brownian_noise(r, x, sigmas);
    const double eta = run_eta(r.s), ratio = 0.5, fac = 1 / (2 * ratio);
    auto t_of = [](const at::Tensor& sigma) { return sigma.log().neg(); };
    auto sigma_of = [](const at::Tensor& t) { return t.neg().exp(); };
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto denoised = k.denoiser(x, sigmas[i], i);
        if (sigmas[i + 1].item<float>() == 0) {
            auto d = to_d(x, sigmas[i], denoised);
            x = x + d * (sigmas[i + 1] - sigmas[i]);
        } else {
            auto t = t_of(sigmas[i]), t_next = t_of(sigmas[i + 1]);
            auto h = t_next - t;
            auto s = t + h * ratio;
            // Step 1, to the midpoint s
            const AncestralStep first = ancestral_step(sigma_of(t), sigma_of(s), eta);
            auto s_ = t_of(first.down);
            auto x_2 = (sigma_of(s_) / sigma_of(t)) * x - (t - s_).expm1() * denoised;
            x_2 = x_2 + (*noise)(sigma_of(t), sigma_of(s)) * 1.0 * first.up;  // s_noise 1
            auto denoised_2 = k.denoiser(x_2, sigma_of(s), i);
            // Step 2
            const AncestralStep second = ancestral_step(sigma_of(t), sigma_of(t_next), eta);
            auto t_next_ = t_of(second.down);
            auto denoised_d = (1 - fac) * denoised + fac * denoised_2;
            x = (sigma_of(t_next_) / sigma_of(t)) * x - (t - t_next_).expm1() * denoised_d;
            x = x + (*noise)(sigma_of(t), sigma_of(t_next)) * 1.0 * second.up;
        }
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace sd
