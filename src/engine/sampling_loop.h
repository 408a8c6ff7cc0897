// The samplers: CompVis PLMS and DDIM (eta = 0), op for op as ldm's plms.py /
// ddim.py do them in float32 including their random draws, and the
// k-diffusion Euler, Euler ancestral and DPM++ 2M samplers (crowsonkb/
// k-diffusion sampling.py, CompVisDenoiser) with model or Karras sigmas,
// diffusers' Euler schedulers with "trailing" timesteps (the SD-Turbo recipe),
// and diffusers' LCMScheduler.
// Models predicting v instead of eps are handled here (see sample()).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "sd/sampler_catalog.h"

namespace sd {

// The guided raw model output (eps, or v for a v-prediction model) for x at
// timesteps t, one per image: int64 for PLMS/DDIM, float32 (fractional) for
// the k-samplers. For the k-samplers x is already scaled by c_in.
using ModelFn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& t)>;
using EpsFn = ModelFn;  // an eps model's ModelFn
// Called after each step with the step number (0-based), the step count, x and
// the step's predicted x0 (the denoised output for the k-samplers).
using StepFn = std::function<void(int step, int total, const at::Tensor& x, const at::Tensor& pred_x0)>;

enum class Parameterization { Eps, V };

// "eps" or "v" (model.json); throws sd::Error otherwise.
Parameterization parse_parameterization(const std::string& name);

struct SamplerSettings {
    std::string sampler = default_sampler();  // a name of sd/sampler_catalog.h
    std::string schedule = "default";  // the sampler row's schedules (core/sampler_list.h)
    int steps = 50;
    Parameterization parameterization = Parameterization::Eps;
    // SDXL (sgm): with the default schedule the k-samplers run as sgm's do (see sample()).
    bool sgm = false;
    // The schedule's betas (model.json linear_start/end), which sgm's
    // discretization recomputes in float64; 0: not known (the float32
    // alphas_cumprod are used instead).
    double linear_start = 0, linear_end = 0;
};

// Runs the sampler from noise (the unscaled start noise, N(0, 1)). gen is the
// run's generator; the random draws follow the references exactly, so that a
// seed gives the reference's images and later batches of a run the same start
// noise as the reference:
//   plms, ddim: one randn the size of x per step even with eta = 0 (multiplied
//     by 0), PLMS one more in its first step;
//   euler: one per step, drawn at its start and discarded (k-diffusion's
//     s_churn = 0 path still draws it);
//   euler_a: one per step except the last, added at the end of the step;
//     with --schedule trailing (diffusers) one in every step, the last too;
//   dpmpp_2m: none;
//   lcm: one per step except the last, at the end of the step.
// --schedule trailing for euler and euler_a is diffusers': x_T = noise * the
// largest sigma, the UNet gets x / sqrt(sigma^2 + 1) and the float timestep.
// sgm (SDXL, settings.sgm) with the default schedule: sgm's
// LegacyDDPMDiscretization (sgm_sigmas), x_T = noise * sqrt(1 + sigma_0^2),
// the UNet gets x * c_in and the integer timestep; euler draws nothing,
// euler_a draws in every step (the last one's discarded), dpmpp_2m none.
// v models: PLMS and the k-samplers convert each guided output to eps
// (eps = sqrt(a) v + sqrt(1 - a) x, k-diffusion's CompVisVDenoiser for the
// k-samplers); DDIM follows Stability-AI's ddim.py v branch.
at::Tensor sample(const SamplerSettings& s, const ModelFn& model, at::Tensor noise,
                  const std::vector<float>& alphas_cumprod, at::Generator& gen, const StepFn& on_step = nullptr);

// k-diffusion pieces, exposed for tests (all float32 tensor ops, as the reference).
// sigma_i = sqrt((1 - a_i) / a_i) for the model's alphas_cumprod, i = 0..T-1.
at::Tensor model_sigmas(const std::vector<float>& alphas_cumprod);
// The steps + 1 sigmas of a run, descending, last 0: "default" = k-diffusion's
// get_sigmas (timesteps linspace(T-1, 0, steps), log-linear between the model's
// sigmas); "karras" = get_sigmas_karras(steps, sigma_min, sigma_max, rho 7);
// "trailing" = diffusers' sigmas at the trailing timesteps (schedule.h).
at::Tensor k_sigmas(const std::string& schedule, int steps, const std::vector<float>& alphas_cumprod);
// sgm's LegacyDDPMDiscretization: the steps + 1 sigmas, last 0, at
// sgm_timesteps (schedule.h), from the schedule recomputed in float64
// (linear_start > 0) or from the float32 alphas_cumprod.
at::Tensor sgm_sigmas(int steps, const std::vector<float>& alphas_cumprod, double linear_start, double linear_end);
// LCMScheduler's c_skip and c_out at integer timestep t (0-dim float32).
std::pair<at::Tensor, at::Tensor> lcm_scalings(int t);
// The continuous timestep of each sigma (CompVisDenoiser.sigma_to_t, quantize=False).
at::Tensor sigma_to_t(const at::Tensor& sigma, const at::Tensor& log_sigmas);

}  // namespace sd
