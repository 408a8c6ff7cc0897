// Timestep schedules of the CompVis samplers.
#pragma once
#include <vector>

namespace sd {

// CompVis "uniform" DDIM/PLMS timesteps, ascending: range(0, T, T / steps) + 1.
// When steps does not divide T this gives more steps than asked for (30 -> 31),
// exactly as the reference does. Requires 1 <= steps <= T.
std::vector<int> compvis_timesteps(int steps, int num_train_timesteps);

}  // namespace sd
