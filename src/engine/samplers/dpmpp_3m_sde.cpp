// k-diffusion's sample_dpmpp_3m_sde: DPM-Solver++(3M) with the Brownian
// trees' noise (noise_sampler.h); the step to 0 returns the denoised latents.
// The web UI runs it with discard_penultimate.
#include "engine/samplers/k_diffusion.h"
#include "engine/samplers/noise_sampler.h"

namespace sd {

at::Tensor sample_dpmpp_3m_sde(const SamplerRun& r) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    at::Tensor x = std::move(k.x);
    const std::unique_ptr<NoiseSampler> noise = brownian_noise(r, x, sigmas);
    const double eta = run_eta(r.s);
    at::Tensor denoised_1, denoised_2, h, h_1, h_2;
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto denoised = k.denoiser(x, sigmas[i], i);
        if (sigmas[i + 1].item<float>() == 0) {
            x = denoised;
        } else {
            auto t = -sigmas[i].log(), s = -sigmas[i + 1].log();
            h = s - t;
            auto h_eta = h * (eta + 1);
            x = at::exp(-h_eta) * x + (-h_eta).expm1().neg() * denoised;
            if (h_2.defined()) {
                auto r0 = h_1 / h, r1 = h_2 / h;
                auto d1_0 = (denoised - denoised_1) / r0;
                auto d1_1 = (denoised_1 - denoised_2) / r1;
                auto d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1);
                auto d2 = (d1_0 - d1_1) / (r0 + r1);
                auto phi_2 = h_eta.neg().expm1() / h_eta + 1;
                auto phi_3 = phi_2 / h_eta - 0.5;
                x = x + phi_2 * d1 - phi_3 * d2;
            } else if (h_1.defined()) {
                auto d = (denoised - denoised_1) / (h_1 / h);
                auto phi_2 = h_eta.neg().expm1() / h_eta + 1;
                x = x + phi_2 * d;
            }
            if (eta != 0)
                x = x + (*noise)(sigmas[i], sigmas[i + 1]) * sigmas[i + 1] * (-2 * h * eta).expm1().neg().sqrt() * 1.0;
        }
        denoised_2 = denoised_1;
        denoised_1 = denoised;
        h_2 = h_1;
        h_1 = h;
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace sd
