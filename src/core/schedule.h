// Timestep schedules of the CompVis samplers.
#pragma once
#include <string>
#include <vector>

namespace sd {

// CompVis "uniform" DDIM/PLMS timesteps, ascending: range(0, T, T / steps) + 1.
// When steps does not divide T this gives more steps than asked for (30 -> 31),
// exactly as the reference does. Requires 1 <= steps <= T.
std::vector<int> compvis_timesteps(int steps, int num_train_timesteps);

// The same with a spacing (--schedule for PLMS and DDIM), ascending, exactly
// `steps` of them for leading and trailing, which accept any 1 <= steps <= T:
//   default:  CompVis's, above (refuses counts that would need timestep T);
//   leading:  i * (T / steps) + 1 for i = 0..steps-1, diffusers' "leading" with
//             SD's steps_offset 1 (the offset dropped at steps = T, where it would reach T);
//   trailing: round(T - i * T / steps) - 1 for i = 0..steps-1, diffusers' "trailing":
//             the first step always starts at T - 1, the noisiest timestep.
std::vector<int> compvis_timesteps(int steps, int num_train_timesteps, const std::string& spacing);

// diffusers' "trailing" timesteps, descending: round(arange(T, 0, -T / steps)) - 1
// with numpy's rounding (half to even), e.g. 4 steps -> 999, 749, 499, 249.
// Requires 1 <= steps <= T.
std::vector<int> trailing_timesteps(int steps, int num_train_timesteps);

// diffusers' LCMScheduler timesteps, descending: of its origin grid
// (k = T / 50; k-1, 2k-1, ..., 50k-1, noisiest first) the entries
// floor(linspace(0, 50, steps, endpoint=False)), e.g. 4 -> 999, 759, 499, 259.
// Throws sd::Error unless 1 <= steps <= 50 (diffusers refuses more) and T >= 50.
std::vector<int> lcm_timesteps(int steps, int num_train_timesteps);

// sgm's LegacyDDPMDiscretization timesteps (SDXL), descending:
// numpy's linspace(T - 1, 0, steps, endpoint=False) truncated to integers,
// e.g. 10 -> 999, 899, ..., 99. Requires 1 <= steps <= T.
std::vector<int> sgm_timesteps(int steps, int num_train_timesteps);

// diffusers' DPMSolverMultistepScheduler "leading" timesteps, descending:
// arange(steps + 1) * (T / (steps + 1)), reversed, the last (0) dropped, + 1,
// e.g. 10 -> 901, 811, ..., 91. Requires 1 <= steps < T.
std::vector<int> dpm_leading_timesteps(int steps, int num_train_timesteps);

// img2img (issue 33): which steps run from given latents (CompVis's t_enc:
// core/img2img_schedule.h compvis_t_enc).
// diffusers' get_timesteps: the position, in the `steps` scheduler timesteps
// (noisiest first), of the first step run: max(S - min(int(S * strength), S), 0);
// S means none runs.
int diffusers_t_start(double strength, int steps);
// The steps an img2img or inpaint run does (sd::sample's arithmetic, for
// messages and metadata). Throws sd::Error unless 0 < strength <= 1, for
// plms (CompVis img2img.py has none), and where sampler_step_count would.
int img2img_step_count(const std::string& sampler, const std::string& schedule, int requested_steps, double strength,
                       int num_train_timesteps);

// Steps a k-sampler runs with a k-diffusion schedule (k_sigmas): `steps`,
// except the web UI's DDIM schedule, which may give one more (12 -> 13); with
// discard_penultimate the schedule is made for steps + 1 and one sigma dropped.
int k_schedule_step_count(const std::string& schedule, int steps, int num_train_timesteps, bool discard_penultimate);

// Steps a sampler really runs with a schedule (sd/sampler_catalog.h's sampler_step_count
// for the default one). Throws sd::Error when the count cannot run.
int sampler_step_count(const std::string& sampler, const std::string& schedule, int requested_steps,
                       int num_train_timesteps);

}  // namespace sd
