#include "sampling/schedule.h"

#include <cmath>

#include "sd/error.h"

namespace sd {

std::vector<int> compvis_timesteps(int steps, int num_train_timesteps) {
    if (steps < 1 || steps > num_train_timesteps)
        throw Error("steps must be between 1 and " + std::to_string(num_train_timesteps) + ", got " + std::to_string(steps));
    auto make = [&](int n) {
        const int c = num_train_timesteps / n;
        std::vector<int> ts;
        for (int t = 0; t < num_train_timesteps; t += c) ts.push_back(t + 1);
        return ts;
    };
    auto ts = make(steps);
    if (ts.back() >= num_train_timesteps) {
        // e.g. 3 steps: range(0, 1000, 333) + 1 ends at 1000, past the model's
        // last timestep; the reference code fails with an IndexError there.
        int lower = steps - 1, higher = steps + 1;
        while (lower > 1 && make(lower).back() >= num_train_timesteps) --lower;
        while (higher < num_train_timesteps && make(higher).back() >= num_train_timesteps) ++higher;
        throw Error("--steps " + std::to_string(steps) + " does not work with the CompVis schedule (it would need timestep " +
                    std::to_string(ts.back()) + "; the model has 0.." + std::to_string(num_train_timesteps - 1) +
                    "); use " + std::to_string(lower) + " or " + std::to_string(higher));
    }
    return ts;
}

std::vector<int> compvis_timesteps(int steps, int num_train_timesteps, const std::string& spacing) {
    if (spacing == "default") return compvis_timesteps(steps, num_train_timesteps);
    const int T = num_train_timesteps;
    if (steps < 1 || steps > T)
        throw Error("steps must be between 1 and " + std::to_string(T) + ", got " + std::to_string(steps));
    std::vector<int> ts;
    if (spacing == "leading") {
        const int c = T / steps;
        const int offset = (steps - 1) * c + 1 <= T - 1 ? 1 : 0;
        for (int i = 0; i < steps; ++i) ts.push_back(i * c + offset);
    } else if (spacing == "trailing") {
        for (int i = steps - 1; i >= 0; --i)
            ts.push_back(static_cast<int>(std::lround(T - static_cast<double>(i) * T / steps)) - 1);
    } else {
        throw Error("unknown spacing '" + spacing + "' (choose default, leading or trailing)");
    }
    return ts;
}

}  // namespace sd
