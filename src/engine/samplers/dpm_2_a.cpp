// k-diffusion's sample_dpm_2_ancestral: DPM-Solver-2 down to the ancestral
// step's sigma_down, then noise times sigma_up (one draw per step that does
// not end at 0). The web UI runs it with discard_penultimate.
#include "engine/samplers/k_diffusion.h"

namespace sd {

at::Tensor sample_dpm_2_a(const SamplerRun& r) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    at::Tensor x = std::move(k.x);
    const double eta = run_eta(r.s);
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto denoised = k.denoiser(x, sigmas[i], i);
        const AncestralStep step = ancestral_step(sigmas[i], sigmas[i + 1], eta);
        auto d = to_d(x, sigmas[i], denoised);
        if (step.down.item<float>() == 0) {
            x = x + d * (step.down - sigmas[i]);
        } else {
            auto sigma_mid = sigmas[i].log().lerp(step.down.log(), 0.5).exp();
            auto dt_1 = sigma_mid - sigmas[i];
            auto dt_2 = step.down - sigmas[i];
            auto x_2 = x + d * dt_1;
            auto denoised_2 = k.denoiser(x_2, sigma_mid, i);
            auto d_2 = to_d(x_2, sigma_mid, denoised_2);
            x = x + d_2 * dt_2;
            x = x + r.draws.next(x) * 1.0 * step.up;  // s_noise 1
        }
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace sd
