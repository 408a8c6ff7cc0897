#include "core/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/img2img_schedule.h"
#include "sd/error.h"
#include "sd/sampler_catalog.h"

namespace sd {

std::vector<int> compvis_timesteps(int steps, int num_train_timesteps) {
    if (steps < 1 || steps > num_train_timesteps)
        throw Error("steps must be between 1 and " + std::to_string(num_train_timesteps) + ", got " +
                    std::to_string(steps));
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
        throw Error("--steps " + std::to_string(steps) +
                    " does not work with the CompVis schedule (it would need timestep " + std::to_string(ts.back()) +
                    "; the model has 0.." + std::to_string(num_train_timesteps - 1) + "); use " +
                    std::to_string(lower) + " or " + std::to_string(higher));
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
        ts = trailing_timesteps(steps, T);
        std::reverse(ts.begin(), ts.end());
    } else {
        throw Error("unknown spacing '" + spacing + "' (choose default, leading or trailing)");
    }
    return ts;
}

std::vector<int> sgm_timesteps(int steps, int num_train_timesteps) {
    if (steps < 1 || steps > num_train_timesteps)
        throw Error("steps must be from 1 to " + std::to_string(num_train_timesteps) + ", got " +
                    std::to_string(steps));
    // numpy's linspace without the endpoint: start + i * ((stop - start) / num) in
    // double, then astype(int), which truncates.
    const double start = num_train_timesteps - 1, step = (0.0 - start) / steps;
    std::vector<int> ts;
    for (int i = 0; i < steps; ++i) ts.push_back(static_cast<int>(static_cast<double>(i) * step + start));
    return ts;
}

std::vector<int> trailing_timesteps(int steps, int num_train_timesteps) {
    const int T = num_train_timesteps;
    if (steps < 1 || steps > T)
        throw Error("steps must be between 1 and " + std::to_string(T) + ", got " + std::to_string(steps));
    // numpy's arange: start + i * delta, delta = (start + step) - start; np.round
    // rounds halves to even (S = 16: 812.5 -> 812), which nearbyint does in the
    // default rounding mode.
    const double step = -static_cast<double>(T) / steps;
    const double delta = (T + step) - T;
    std::vector<int> ts;
    for (int i = 0; i < steps; ++i) ts.push_back(static_cast<int>(std::nearbyint(T + i * delta)) - 1);
    return ts;
}

std::vector<int> lcm_timesteps(int steps, int num_train_timesteps) {
    const int origin = kLcmOriginSteps;
    if (steps < 1 || steps > origin)
        throw Error("--steps " + std::to_string(steps) +
                    " does not work with the LCM sampler: its timesteps are taken from a " + std::to_string(origin) +
                    "-step grid, so it runs 1 to " + std::to_string(origin) + " steps (as diffusers' LCMScheduler)");
    const int k = num_train_timesteps / origin;
    if (k < 1)
        throw Error("the LCM sampler needs a noise schedule of at least " + std::to_string(origin) +
                    " timesteps; this model has " + std::to_string(num_train_timesteps));
    const double stride = static_cast<double>(origin) / steps;  // linspace(0, 50, steps, endpoint=False)
    std::vector<int> ts;
    for (int i = 0; i < steps; ++i) {
        const int idx = static_cast<int>(std::floor(i * stride));
        ts.push_back((origin - idx) * k - 1);  // the grid reversed: entry idx of 50k-1, ..., k-1
    }
    return ts;
}

std::vector<int> dpm_leading_timesteps(int steps, int num_train_timesteps) {
    const int T = num_train_timesteps;
    if (steps < 1 || steps >= T)
        throw Error("steps must be between 1 and " + std::to_string(T - 1) + ", got " + std::to_string(steps));
    const int ratio = T / (steps + 1);
    std::vector<int> ts;
    for (int i = steps; i >= 1; --i) ts.push_back(i * ratio + 1);
    return ts;
}

int k_schedule_step_count(const std::string& schedule, int steps, int num_train_timesteps, bool discard_penultimate) {
    if (schedule != "ddim" || steps < 1) return steps;
    const int made = discard_penultimate ? steps + 1 : steps;
    const int stride = std::max(num_train_timesteps / made, 1);
    const int count = (num_train_timesteps - 1 + stride - 1) / stride;  // 1, 1 + stride, ... below T
    return discard_penultimate ? count - 1 : count;
}

int diffusers_t_start(double strength, int steps) { return diffusers_img2img_plan(steps, strength).t_start; }

int img2img_step_count(const std::string& sampler, const std::string& schedule, int requested_steps, double strength,
                       int num_train_timesteps) {
    check_strength("--strength", strength);
    check_sampler_settings(sampler, schedule);
    const std::string runs = effective_schedule(sampler, schedule);
    if (sampler == "plms")
        throw Error(
            "the plms sampler cannot start from an image (CompVis img2img.py has no PLMS); use ddim or another "
            "sampler");
    const int total = sampler_step_count(sampler, runs, requested_steps, num_train_timesteps);
    if (sampler == "ddim" && runs == "default") return std::min(compvis_t_enc(strength, requested_steps), total);
    return total - diffusers_t_start(strength, total);
}

}  // namespace sd
