// k-diffusion's pieces the k-samplers share (crowsonkb/k-diffusion
// sampling.py and external.py, CompVisDenoiser): the denoiser, to_d, the
// ancestral step, and a run's sigmas and start. Sigmas are 0-dim float32
// tensors and every formula is written with the reference's tensor ops, so
// that the float32 rounding is the reference's.
#pragma once
#include <vector>

#include <ATen/ATen.h>

#include "engine/samplers/sampler_run.h"

namespace sd {

// Whose sampler code a k-sampler follows: k-diffusion's (continuous timesteps),
// diffusers' (--schedule leading|trailing) or sgm's (SDXL, default schedule).
enum class Flavour { KDiffusion, Diffusers, Sgm };

// CompVisDenoiser (eps) / CompVisVDenoiser (v) around the guided model:
// D(x, sigma, step) with c_in = 1 / sqrt(sigma^2 + 1) and the continuous
// timestep. With step_t it is diffusers' Euler schedulers instead (x /
// sqrt(sigma^2 + 1) and the step's own float timestep), or sgm's (x c_in and
// the step's integer timestep).
struct Denoiser {
    const ModelFn& model;
    Parameterization p;
    at::Tensor log_sigmas;
    std::vector<int> step_t;  // diffusers, sgm: each step's timestep; empty: k-diffusion's sigma_to_t
    Flavour flavour = Flavour::KDiffusion;

    at::Tensor operator()(const at::Tensor& x, const at::Tensor& sigma, int step) const;
};

// (x - denoised) / sigma
at::Tensor to_d(const at::Tensor& x, const at::Tensor& sigma, const at::Tensor& denoised);

// get_ancestral_step(from, to, eta): up = min(to, eta sqrt(to^2 (from^2 - to^2) / from^2)),
// down = sqrt(to^2 - up^2); (to, 0) for eta 0.
struct AncestralStep {
    at::Tensor down, up;
};
AncestralStep ancestral_step(const at::Tensor& from, const at::Tensor& to, double eta);

// The eta a sampler with the "eta" option runs: the settings' or 1 (k-diffusion's and the web UI's default).
double run_eta(const SamplerSettings& s);

// The sigmas a k-sampler runs: k_sigmas of its schedule, made for steps + 1
// with the next-to-last one dropped where its row says discard_penultimate
// (the web UI's KDiffusionSampler.get_sigmas).
at::Tensor sampler_sigmas(const SamplerSettings& s, const std::vector<float>& ac);

// A k-sampler's run: its sigmas from the first step run on (last 0 except
// KL Optimal's), the denoiser, the x it starts from and the blend.
struct KRun {
    at::Tensor sigmas;
    Denoiser denoiser;
    at::Tensor x;
    AfterStep after;
};

// The start of txt2img is noise times the schedule's initial sigma:
// k-diffusion's sigmas[0]; diffusers' init_noise_sigma, sqrt(sigma_max^2 + 1)
// for leading and sigma_max (= sigmas[0]) for trailing; sgm's sqrt(1 +
// sigma_0^2) (prepare_sampling_loop), only where sgm_flavour says the sampler
// has one (the web UI runs SDXL through k-diffusion's denoiser). img2img
// starts at entry t_start of the sigmas with x0 + sigma noise, as diffusers'
// Euler schedulers' add_noise.
KRun k_run(const SamplerRun& r, bool sgm_flavour = false);

}  // namespace sd
