// k-diffusion's sample_heun (s_churn 0): Heun's method between consecutive
// sigmas, Euler's for the step to 0. One discarded draw per step.
#include "engine/samplers/k_diffusion.h"

namespace sd {

at::Tensor sample_heun(const SamplerRun& r) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    at::Tensor x = std::move(k.x);
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        r.draws.next(x);                   // eps, drawn even with s_churn = 0
        auto sigma_hat = sigmas[i] * 1.0;  // sigma * (gamma + 1), gamma = 0
        auto denoised = k.denoiser(x, sigma_hat, i);
        auto d = to_d(x, sigma_hat, denoised);
        auto dt = sigmas[i + 1] - sigma_hat;
        if (sigmas[i + 1].item<float>() == 0) {
            x = x + d * dt;
        } else {
            auto x_2 = x + d * dt;
            auto denoised_2 = k.denoiser(x_2, sigmas[i + 1], i);
            auto d_2 = to_d(x_2, sigmas[i + 1], denoised_2);
            auto d_prime = (d + d_2) / 2;
            x = x + d_prime * dt;
        }
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace sd
