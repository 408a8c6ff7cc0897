// k-diffusion's sample_dpmpp_2s_ancestral: a DPM-Solver++(2S) step down to the
// ancestral step's sigma_down (Euler's when that is 0), then noise times
// sigma_up (one draw per step that does not end at 0).
#include "engine/samplers/k_diffusion.h"

namespace sd {

at::Tensor sample_dpmpp_2s_a(const SamplerRun& r) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    at::Tensor x = std::move(k.x);
    const double eta = run_eta(r.s);
    auto t_of = [](const at::Tensor& sigma) { return sigma.log().neg(); };
    auto sigma_of = [](const at::Tensor& t) { return t.neg().exp(); };
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto denoised = k.denoiser(x, sigmas[i], i);
        const AncestralStep step = ancestral_step(sigmas[i], sigmas[i + 1], eta);
        if (step.down.item<float>() == 0) {
            auto d = to_d(x, sigmas[i], denoised);
            x = x + d * (step.down - sigmas[i]);
        } else {
            auto t = t_of(sigmas[i]), t_next = t_of(step.down);
            const double ratio = 0.5;
            auto h = t_next - t;
            auto s = t + ratio * h;
            auto x_2 = (sigma_of(s) / sigma_of(t)) * x - (-h * ratio).expm1() * denoised;
            auto denoised_2 = k.denoiser(x_2, sigma_of(s), i);
            x = (sigma_of(t_next) / sigma_of(t)) * x - (-h).expm1() * denoised_2;
        }
        if (sigmas[i + 1].item<float>() > 0) x = x + r.draws.next(x) * 1.0 * step.up;  // s_noise 1
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace sd
