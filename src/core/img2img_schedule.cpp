#include "core/img2img_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "sd/error.h"

namespace sd {

double check_strength(const std::string& what, double strength) {
    if (!std::isfinite(strength) || strength <= 0 || strength > 1) {
        std::ostringstream os;
        os << what << " must be above 0 and at most 1, got " << strength;
        throw Error(os.str());
    }
    return strength;
}

int compvis_t_enc(double strength, int steps) {
    // One IEEE double product, truncated toward zero: Python's int(strength * S).
    return static_cast<int>(strength * static_cast<double>(steps));
}

CompVisImg2ImgPlan compvis_img2img_plan(const std::vector<int>& ddim_timesteps, int steps, double strength) {
    if (ddim_timesteps.empty()) throw Error("img2img needs a schedule with at least one timestep");
    CompVisImg2ImgPlan p;
    p.t_enc = compvis_t_enc(strength, steps);
    const int count = static_cast<int>(ddim_timesteps.size());
    if (p.t_enc >= count) {
        p.pure_noise = true;
        for (int i = count - 1; i >= 0; --i) p.indices.push_back(i);
    } else {
        p.noise_timestep = ddim_timesteps[static_cast<size_t>(std::max(p.t_enc, 0))];
        for (int i = p.t_enc - 1; i >= 0; --i) p.indices.push_back(i);
    }
    for (int i : p.indices) p.timesteps.push_back(ddim_timesteps[static_cast<size_t>(i)]);
    return p;
}

DiffusersImg2ImgPlan diffusers_img2img_plan(int steps, double strength) {
    DiffusersImg2ImgPlan p;
    p.init_timestep = std::min(static_cast<int>(static_cast<double>(steps) * strength), steps);
    p.t_start = std::max(steps - p.init_timestep, 0);
    return p;
}

}  // namespace sd
