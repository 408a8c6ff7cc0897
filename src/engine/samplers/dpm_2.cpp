// k-diffusion's sample_dpm_2 (s_churn 0): a DPM-Solver-2 step through the
// log-midpoint of each pair of sigmas, Euler's for the step to 0. One
// discarded draw per step. The web UI runs it with discard_penultimate.
#include "engine/samplers/k_diffusion.h"

namespace sd {

at::Tensor sample_dpm_2(const SamplerRun& r) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    at::Tensor x = std::move(k.x);
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        r.draws.next(x);                   // eps, drawn even with s_churn = 0
        auto sigma_hat = sigmas[i] * 1.0;  // sigma * (gamma + 1), gamma = 0
        auto denoised = k.denoiser(x, sigma_hat, i);
        auto d = to_d(x, sigma_hat, denoised);
        if (sigmas[i + 1].item<float>() == 0) {
            x = x + d * (sigmas[i + 1] - sigma_hat);
        } else {
            auto sigma_mid = sigma_hat.log().lerp(sigmas[i + 1].log(), 0.5).exp();
            auto dt_1 = sigma_mid - sigma_hat;
            auto dt_2 = sigmas[i + 1] - sigma_hat;
            auto x_2 = x + d * dt_1;
            auto denoised_2 = k.denoiser(x_2, sigma_mid, i);
            auto d_2 = to_d(x_2, sigma_mid, denoised_2);
            x = x + d_2 * dt_2;
        }
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace sd
