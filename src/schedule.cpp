#include "schedule.h"

#include "error.h"

namespace sd {

std::vector<int> compvis_timesteps(int steps, int num_train_timesteps) {
    if (steps < 1 || steps > num_train_timesteps)
        throw Error("steps must be between 1 and " + std::to_string(num_train_timesteps) + ", got " + std::to_string(steps));
    const int c = num_train_timesteps / steps;
    std::vector<int> ts;
    for (int t = 0; t < num_train_timesteps; t += c) ts.push_back(t + 1);
    return ts;
}

}  // namespace sd
