// k-diffusion's sample_dpmpp_2m_sde, solver_type midpoint (the web UI's
// "DPM++ 2M SDE") and heun ("DPM++ 2M SDE Heun"): DPM-Solver++(2M) with the
// Brownian trees' noise (noise_sampler.h); the step to 0 returns the
// denoised latents.
#include "engine/samplers/k_diffusion.h"
#include "engine/samplers/noise_sampler.h"

namespace sd {

namespace {

at::Tensor run_dpmpp_2m_sde(const SamplerRun& r, bool heun) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    at::Tensor x = std::move(k.x);
    const std::unique_ptr<NoiseSampler> noise = brownian_noise(r, x, sigmas);
    const double eta = run_eta(r.s);
    at::Tensor old_denoised, h_last, h;
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto denoised = k.denoiser(x, sigmas[i], i);
        if (sigmas[i + 1].item<float>() == 0) {
            x = denoised;
        } else {
            auto t = -sigmas[i].log(), s = -sigmas[i + 1].log();
            h = s - t;
            auto eta_h = eta * h;
            x = sigmas[i + 1] / sigmas[i] * (-eta_h).exp() * x + (-h - eta_h).expm1().neg() * denoised;
            if (old_denoised.defined()) {
                auto r_inv = (h_last / h).reciprocal();  // Python's 1 / r
                if (heun)
                    x = x + ((-h - eta_h).expm1().neg() / (-h - eta_h) + 1) * r_inv * (denoised - old_denoised);
                else
                    x = x + 0.5 * (-h - eta_h).expm1().neg() * r_inv * (denoised - old_denoised);
            }
            if (eta != 0)
                x = x + (*noise)(sigmas[i], sigmas[i + 1]) * sigmas[i + 1] * (-2 * eta_h).expm1().neg().sqrt() * 1.0;
        }
        old_denoised = denoised;
        h_last = h;
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace

at::Tensor sample_dpmpp_2m_sde(const SamplerRun& r) { return run_dpmpp_2m_sde(r, false); }

at::Tensor sample_dpmpp_2m_sde_heun(const SamplerRun& r) { return run_dpmpp_2m_sde(r, true); }

}  // namespace sd
