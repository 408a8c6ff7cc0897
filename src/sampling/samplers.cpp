#include "sd/samplers.h"

#include "sampling/sampler_list.h"
#include "sampling/schedule.h"
#include "sd/error.h"

namespace sd {

const std::vector<SamplerInfo>& samplers() {
#define SD_SAMPLER_ROW(function, name, a1111, family) SamplerInfo{name, a1111, SamplerFamily::family},
    static const std::vector<SamplerInfo> rows = {SD_SAMPLERS(SD_SAMPLER_ROW)};
#undef SD_SAMPLER_ROW
    return rows;
}

const std::string& default_sampler() { return samplers().front().name; }

std::string sampler_choices() {
    std::string text;
    const auto& all = samplers();
    for (size_t i = 0; i < all.size(); ++i)
        text += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i].name;
    return text;
}

const SamplerInfo& sampler_info(const std::string& name) {
    for (const auto& s : samplers())
        if (s.name == name) return s;
    throw Error("unknown sampler '" + name + "' (choose " + sampler_choices() + ")");
}

void check_sampler_settings(const std::string& sampler, const std::string& schedule) {
    const SamplerInfo& info = sampler_info(sampler);
    if (schedule != "default" && schedule != "karras" && schedule != "leading" && schedule != "trailing")
        throw Error("unknown schedule '" + schedule + "' (choose default or karras; leading or trailing for PLMS and DDIM)");
    if ((schedule == "leading" || schedule == "trailing") && info.family != SamplerFamily::compvis) {
        std::string c;
        for (const auto& s : samplers())
            if (s.family == SamplerFamily::compvis) c += (c.empty() ? "" : " and ") + s.name;
        throw Error("--schedule " + schedule + " applies to " + c + " only, not to " + sampler);
    }
    if (schedule == "karras" && info.family != SamplerFamily::k_diffusion) {
        std::string k;
        for (const auto& s : samplers())
            if (s.family == SamplerFamily::k_diffusion) k += (k.empty() ? "" : ", ") + s.name;
        const auto comma = k.find_last_of(',');
        if (comma != std::string::npos) k.replace(comma, 1, " and");
        throw Error("--schedule " + schedule + " applies to " + k + " only, not to " + sampler);
    }
}

int sampler_step_count(const std::string& sampler, int requested_steps, int num_train_timesteps) {
    return sampler_step_count(sampler, "default", requested_steps, num_train_timesteps);
}

int sampler_step_count(const std::string& sampler, const std::string& schedule, int requested_steps, int num_train_timesteps) {
    if (sampler_info(sampler).family == SamplerFamily::k_diffusion) return requested_steps;
    return static_cast<int>(compvis_timesteps(requested_steps, num_train_timesteps, schedule).size());
}

}  // namespace sd
