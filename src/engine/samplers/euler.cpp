// k-diffusion's sample_euler (s_churn 0), and with --schedule leading|trailing
// diffusers' EulerDiscreteScheduler, and sgm's EulerEDMSampler for SDXL.
#include "engine/samplers/k_diffusion.h"

namespace sd {

namespace {

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

}  // namespace

at::Tensor sample_euler(const SamplerRun& r) {
    KRun k = k_run(r, true);
    return run_euler(k.denoiser, std::move(k.x), k.sigmas, r.draws, k.after, r.on_step);
}

}  // namespace sd
