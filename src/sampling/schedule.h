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

// Steps a sampler really runs with a schedule (sd/samplers.h's sampler_step_count
// for the default one). Throws sd::Error when the count cannot run.
int sampler_step_count(const std::string& sampler, const std::string& schedule, int requested_steps, int num_train_timesteps);

}  // namespace sd
