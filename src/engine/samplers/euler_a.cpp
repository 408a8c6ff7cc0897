// k-diffusion's sample_euler_ancestral (eta 1 unless set), and with
// --schedule leading|trailing diffusers' EulerAncestralDiscreteScheduler, and
// sgm's EulerAncestralSampler for SDXL.
#include "engine/samplers/k_diffusion.h"

namespace sd {

namespace {

// k-diffusion's sample_euler_ancestral; diffusers' EulerAncestralDiscreteScheduler
// step draws its noise in every step (the last one's multiplied by sigma_up = 0)
// and does not clamp sigma_up; sgm's EulerAncestralSampler clamps it and draws
// in every step, the last one's discarded.
at::Tensor run_euler_ancestral(const Denoiser& D, at::Tensor x, const at::Tensor& sigmas, double eta, StepNoise& draws,
                               const AfterStep& after, const StepFn& on_step) {
    const bool diffusers = D.flavour == Flavour::Diffusers, sgm = D.flavour == Flavour::Sgm;
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto from = sigmas[i], to = sigmas[i + 1];
        auto denoised = D(x, from, i);
        at::Tensor up, down;
        if (D.flavour == Flavour::KDiffusion) {
            const AncestralStep step = ancestral_step(from, to, eta);
            down = step.down;
            up = step.up;
        } else {  // their own get_ancestral_step, with eta = 1
            up = at::pow(at::pow(to, 2) * (at::pow(from, 2) - at::pow(to, 2)) / at::pow(from, 2), 0.5);
            if (!diffusers && to.item<float>() < up.item<float>()) up = to;
            down = at::pow(at::pow(to, 2) - at::pow(up, 2), 0.5);
        }
        auto d = to_d(x, from, denoised);
        x = x + d * (down - from);
        if (sgm) {
            auto noise = draws.next(x);
            if (to.item<float>() > 0) x = x + noise * 1.0 * up;
        } else if (diffusers || to.item<float>() > 0) {
            x = x + draws.next(x) * 1.0 * up;
        }
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace

at::Tensor sample_euler_a(const SamplerRun& r) {
    KRun k = k_run(r, true);
    return run_euler_ancestral(k.denoiser, std::move(k.x), k.sigmas, run_eta(r.s), r.draws, k.after, r.on_step);
}

}  // namespace sd
