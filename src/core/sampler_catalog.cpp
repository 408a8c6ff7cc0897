#include "sd/sampler_catalog.h"

#include <algorithm>

#include "core/sampler_list.h"
#include "core/schedule.h"
#include "sd/error.h"

namespace sd {

namespace {

// A row's schedules column: names separated by spaces.
std::vector<std::string> words(const std::string& text) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < text.size()) {
        const size_t end = std::min(text.find(' ', i), text.size());
        if (end > i) out.push_back(text.substr(i, end - i));
        i = end + 1;
    }
    return out;
}

// "a, b and c"
std::string listed(const std::vector<std::string>& items) {
    std::string text;
    for (size_t i = 0; i < items.size(); ++i) text += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
    return text;
}

}  // namespace

const std::vector<SamplerInfo>& samplers() {
#define SD_SAMPLER_ROW(function, name, a1111, family, schedules) \
    SamplerInfo{name, a1111, SamplerFamily::family, words(schedules)},
    static const std::vector<SamplerInfo> rows = {SD_SAMPLERS(SD_SAMPLER_ROW)};
#undef SD_SAMPLER_ROW
    return rows;
}

const std::string& default_sampler() { return samplers().front().name; }

std::string sampler_choices() {
    std::string text;
    const auto& all = samplers();
    for (size_t i = 0; i < all.size(); ++i) text += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i].name;
    return text;
}

const SamplerInfo& sampler_info(const std::string& name) {
    for (const auto& s : samplers())
        if (s.name == name) return s;
    throw Error("unknown sampler '" + name + "' (choose " + sampler_choices() + ")");
}

void check_sampler_settings(const std::string& sampler, const std::string& schedule) {
    const SamplerInfo& info = sampler_info(sampler);
    std::vector<std::string> known, takers;  // every schedule; the samplers taking this one
    for (const auto& s : samplers()) {
        for (const auto& name : s.schedules)
            if (std::find(known.begin(), known.end(), name) == known.end()) known.push_back(name);
        if (std::find(s.schedules.begin(), s.schedules.end(), schedule) != s.schedules.end()) takers.push_back(s.name);
    }
    if (takers.empty()) {
        std::string choices = listed(known);
        if (const size_t last = choices.rfind(" and "); last != std::string::npos) choices.replace(last, 5, " or ");
        throw Error("unknown schedule '" + schedule + "' (choose " + choices + ")");
    }
    if (std::find(info.schedules.begin(), info.schedules.end(), schedule) == info.schedules.end())
        throw Error("--schedule " + schedule + " applies to " + listed(takers) + " only, not to " + sampler);
}

void check_sampler_settings(const std::string& sampler, const std::string& schedule, int steps) {
    check_sampler_settings(sampler, schedule);
    if (sampler_info(sampler).family == SamplerFamily::lcm) lcm_timesteps(steps, 1000);  // the grid's limit, any model
}

int sampler_step_count(const std::string& sampler, int requested_steps, int num_train_timesteps) {
    return sampler_step_count(sampler, "default", requested_steps, num_train_timesteps);
}

int sampler_step_count(const std::string& sampler, const std::string& schedule, int requested_steps,
                       int num_train_timesteps) {
    const SamplerFamily family = sampler_info(sampler).family;
    if (family == SamplerFamily::k_diffusion) return requested_steps;
    if (family == SamplerFamily::lcm)
        return static_cast<int>(lcm_timesteps(requested_steps, num_train_timesteps).size());
    return static_cast<int>(compvis_timesteps(requested_steps, num_train_timesteps, schedule).size());
}

}  // namespace sd
