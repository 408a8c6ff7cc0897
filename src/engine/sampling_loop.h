// The samplers: CompVis PLMS and DDIM (eta = 0), op for op as ldm's plms.py /
// ddim.py do them in float32 including their random draws, and the
// k-diffusion samplers (crowsonkb/k-diffusion sampling.py, CompVisDenoiser;
// engine/samplers/) with the schedules of k-diffusion and of the web UI,
// diffusers' Euler schedulers with "leading" or "trailing" timesteps (the
// SD-Turbo recipe), diffusers' DPMSolverMultistepScheduler (DPM++ 2M with
// "leading" timesteps, or Karras sigmas in img2img) and diffusers' LCMScheduler.
// Each can start from given latents (img2img, inpainting; issue 33).
// Models predicting v instead of eps are handled here (see sample()).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "engine/step_noise.h"
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
    std::string schedule = "default";         // the sampler row's schedules or "automatic" (core/sampler_list.h)
    int steps = 50;
    Parameterization parameterization = Parameterization::Eps;
    // SDXL (sgm): with the default schedule the k-samplers run as sgm's do (see sample()).
    bool sgm = false;
    // The schedule's betas (model.json linear_start/end), which sgm's
    // discretization recomputes in float64; 0: not known (the float32
    // alphas_cumprod are used instead).
    double linear_start = 0, linear_end = 0;
    // img2img / inpainting (only with init latents): the share of the
    // schedule that runs, 0 < strength <= 1 (see sample()).
    double strength = 1.0;
    // The web UI's choices (issue 35). eta: the noise of the samplers whose
    // row has the "eta" option (k-diffusion's flavour only); unset: 1.
    std::optional<double> eta;
    double beta_alpha = 0.6, beta_beta = 0.6;  // --schedule beta's distribution
    // The SDE samplers' Brownian trees (row option "brownian"): "a1111", one
    // tree per image seeded with seeds[i]; "kdiffusion", one tree for the
    // batch seeded by draws.next_tree_seed() before any other draw.
    std::string brownian_tree = "a1111";
    std::vector<uint64_t> seeds;  // the web UI's seed of each image of the batch (its all_seeds)
};

// The latent blend of inpainting with a plain 4-channel UNet (diffusers'
// StableDiffusionInpaintPipeline, num_channels_unet == 4). After every step
//   x = (1 - mask) * proper + mask * x,
// where proper is sample()'s init_latents noised with sample()'s start noise
// to the level x has after the step (the scheduler's add_noise at the next
// step's timestep), and the init latents themselves after the last step.
// With a blend, strength 1.0 starts from the noise alone (times the
// schedule's initial sigma, as txt2img does; diffusers' is_strength_max);
// the steps run are those of img2img.
struct InpaintBlend {
    at::Tensor mask;  // [n or 1, 1, h, w] float32 at latent size: 1 = repaint, 0 = keep
};

// Runs the sampler from noise (the unscaled start noise, N(0, 1)). draws gives
// each step's noise (engine/step_noise.h); the random draws follow the references exactly, so that a
// seed gives the reference's images and later batches of a run the same start
// noise as the reference:
//   plms, ddim: one randn the size of x per step even with eta = 0 (multiplied
//     by 0), PLMS one more in its first step;
//   euler: one per step, drawn at its start and discarded (k-diffusion's
//     s_churn = 0 path still draws it);
//   euler_a: one per step except the last, added at the end of the step;
//     with --schedule leading|trailing (diffusers) one in every step, the last too;
//   dpmpp_2m, lms: none;
//   lcm: one per step except the last, at the end of the step;
//   heun, dpm_2: one per step, drawn at its start and discarded (as euler);
//   dpm_2_a, dpmpp_2s_a: one per step that adds noise (not when the step
//     goes to 0), at its end;
//   dpmpp_sde, dpmpp_2m_sde(_heun), dpmpp_3m_sde: none from draws.next();
//     their noise comes from Brownian trees (engine/brownian_tree.h, see
//     SamplerSettings::brownian_tree), each result passed to draws.noted().
// --schedule leading|trailing for euler and euler_a is diffusers'
// (Euler[Ancestral]DiscreteScheduler): x_T = noise * init_noise_sigma, which
// is sqrt(sigma_max^2 + 1) for leading and sigma_max for trailing, the UNet
// gets x / sqrt(sigma^2 + 1) and the float timestep. --schedule leading for
// dpmpp_2m is diffusers' DPMSolverMultistepScheduler (x_T = noise, the UNet
// gets x and the integer timestep).
// sgm (SDXL, settings.sgm) with the default schedule: sgm's
// LegacyDDPMDiscretization (sgm_sigmas), x_T = noise * sqrt(1 + sigma_0^2),
// the UNet gets x * c_in and the integer timestep; euler draws nothing,
// euler_a draws in every step (the last one's discarded), dpmpp_2m none.
// v models: PLMS and the k-samplers convert each guided output to eps
// (eps = sqrt(a) v + sqrt(1 - a) x, k-diffusion's CompVisVDenoiser for the
// k-samplers); DDIM follows Stability-AI's ddim.py v branch.
//
// Starting from init_latents ([n or 1, 4, h, w], the encoded image already
// times the VAE's scale factor; the caller draws the posterior noise and then
// `noise` from gen, in the references' order): the steps run and the start
// come from s.strength, by whose arithmetic the schedule decides:
//   ddim with --schedule default: CompVis img2img.py. t_enc = int(strength *
//     steps) (compvis_t_enc), x = sqrt(a) x0 + sqrt(1 - a) noise with a the
//     DDIM alpha of ddim_timesteps[t_enc], then DDIM (drawing as txt2img)
//     from ddim_timesteps[t_enc - 1] down: noised one step above the first
//     step run. Where t_enc is past the table (strength 1.0 when the table
//     has exactly `steps` entries; img2img.py fails with an index error
//     there), x is noised to the top DDIM timestep and every step runs.
//   everything else: diffusers' img2img pipeline. t_start = diffusers_t_start
//     (get_timesteps), x = the scheduler's add_noise(x0, noise) at the
//     schedule's entry t_start, the first step at that same entry:
//       ddim leading|trailing, lcm: sqrt(ac_t) x0 + sqrt(1 - ac_t) noise;
//       ddim draws nothing (diffusers' DDIMScheduler with eta 0), lcm as txt2img;
//       euler, euler_a: x0 + sigma noise (any schedule: leading|trailing are
//       diffusers' schedulers, default|karras k-diffusion's sigmas sliced);
//       dpmpp_2m leading, and dpmpp_2m karras (only here: txt2img karras
//       stays k-diffusion's): diffusers' DPMSolverMultistepScheduler,
//       alpha x0 + alpha sigma noise, alpha = 1 / sqrt(sigma^2 + 1); karras
//       with diffusers' float64 Karras sigmas and rounded timesteps;
//       dpmpp_2m default: k-diffusion's sigmas sliced, x0 + sigma noise.
//     strength * steps < 1 runs no step and returns the init latents.
//   plms: refused (sd::Error): CompVis img2img.py has no PLMS.
// blend (4-channel inpainting, see InpaintBlend) needs init_latents.
// Without init_latents strength is ignored and the run is txt2img's.
at::Tensor sample(const SamplerSettings& s, const ModelFn& model, at::Tensor noise,
                  const std::vector<float>& alphas_cumprod, StepNoise& draws, const StepFn& on_step = nullptr,
                  const at::Tensor& init_latents = {}, const InpaintBlend* blend = nullptr);
// The same with every draw from one CPU generator (GeneratorNoise).
at::Tensor sample(const SamplerSettings& s, const ModelFn& model, at::Tensor noise,
                  const std::vector<float>& alphas_cumprod, at::Generator& gen, const StepFn& on_step = nullptr,
                  const at::Tensor& init_latents = {}, const InpaintBlend* blend = nullptr);

// k-diffusion pieces, exposed for tests (all float32 tensor ops, as the reference).
// sigma_i = sqrt((1 - a_i) / a_i) for the model's alphas_cumprod, i = 0..T-1.
at::Tensor model_sigmas(const std::vector<float>& alphas_cumprod);
// The sigmas of a run, descending, last 0 (steps + 1 of them unless noted),
// with sigma_min, sigma_max the model's smallest and largest sigma:
//   "default" = k-diffusion's get_sigmas (timesteps linspace(T-1, 0, steps),
//     log-linear between the model's sigmas; the web UI's "Uniform");
//   "karras" = get_sigmas_karras(rho 7); "exponential" = get_sigmas_exponential;
//   "polyexponential" = get_sigmas_polyexponential(rho 1);
//   the web UI's (sd_schedulers.py, core/a1111_schedules.h): "sgm_uniform",
//     "normal", "simple", "ddim" (steps + 2 sigmas when 1 + steps (T // steps) < T),
//     "beta" (o.beta_alpha, o.beta_beta), "kl_optimal" (steps + 1 sigmas, the
//     last sigma_min, no 0), "align_your_steps" (o.sdxl picks the SDXL list);
//   "leading", "trailing" = diffusers' Euler schedulers' sigmas at those
//     timesteps (schedule.h).
struct KScheduleOptions {
    bool sdxl = false;
    double beta_alpha = 0.6, beta_beta = 0.6;
};
at::Tensor k_sigmas(const std::string& schedule, int steps, const std::vector<float>& alphas_cumprod,
                    const KScheduleOptions& o = {});
// sgm's LegacyDDPMDiscretization: the steps + 1 sigmas, last 0, at
// sgm_timesteps (schedule.h), from the schedule recomputed in float64
// (linear_start > 0) or from the float32 alphas_cumprod.
at::Tensor sgm_sigmas(int steps, const std::vector<float>& alphas_cumprod, double linear_start, double linear_end);
// diffusers' DPMSolverMultistepScheduler with use_karras_sigmas: the steps + 1
// sigmas (Karras's, computed in float64 between the model's smallest and
// largest sigma, then float32; last 0) and the steps integer timesteps
// round(sigma_to_t(sigma)), e.g. 15 steps -> 999, 948, ..., 3, 0.
std::pair<at::Tensor, std::vector<int>> dpm_karras_schedule(int steps, const std::vector<float>& alphas_cumprod);
// LCMScheduler's c_skip and c_out at integer timestep t (0-dim float32).
std::pair<at::Tensor, at::Tensor> lcm_scalings(int t);
// The continuous timestep of each sigma (CompVisDenoiser.sigma_to_t, quantize=False).
at::Tensor sigma_to_t(const at::Tensor& sigma, const at::Tensor& log_sigmas);

}  // namespace sd
