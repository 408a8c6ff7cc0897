#include "sd/sampler_catalog.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/sampler_list.h"
#include "core/schedule.h"
#include "sd/error.h"

namespace sd {

namespace {

// A row's schedules or options column: names separated by spaces.
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

// "a, b and c" (or "a, b or c")
std::string listed(const std::vector<std::string>& items, const char* last = " and ") {
    std::string text;
    for (size_t i = 0; i < items.size(); ++i) text += (i == 0 ? "" : i + 1 == items.size() ? last : ", ") + items[i];
    return text;
}

bool same_letters(const std::string& a, const std::string& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

struct ScheduleLabel {
    const char* name;
    const char* label;
};

const ScheduleLabel kScheduleLabels[] = {
#define SD_SCHEDULE_LABEL_ROW(name, label) {name, label},
    SD_SCHEDULE_LABELS(SD_SCHEDULE_LABEL_ROW)
#undef SD_SCHEDULE_LABEL_ROW
};

// A name of the web UI: its own name, or "k_" + ours (its aliases, "k_dpmpp_2m").
const SamplerInfo* find_sampler(const std::string& name) {
    for (const auto& s : samplers())
        if (s.name == name || same_letters(s.a1111_name, name) || name == "k_" + s.name) return &s;
    return nullptr;
}

}  // namespace

bool SamplerInfo::has(const std::string& option) const {
    return std::find(options.begin(), options.end(), option) != options.end();
}

int prompt_schedule_steps(const std::string& sampler, int steps) {
    // An unknown name is check_sampler_settings' to refuse, not this count's.
    for (const auto& info : samplers())
        if (info.name == sampler) return steps * (info.has("second_order") ? 2 : 1);
    return steps;
}

const std::vector<SamplerInfo>& samplers() {
#define SD_SAMPLER_ROW(function, name, a1111, family, schedules, automatic, options) \
    SamplerInfo{name, a1111, SamplerFamily::family, words(schedules), automatic, words(options)},
    static const std::vector<SamplerInfo> rows = {SD_SAMPLERS(SD_SAMPLER_ROW)};
#undef SD_SAMPLER_ROW
    return rows;
}

const std::string& default_sampler() { return samplers().front().name; }

std::string sampler_choices() {
    std::vector<std::string> names;
    for (const auto& s : samplers()) names.push_back(s.name);
    return listed(names, " or ");
}

const SamplerInfo& sampler_info(const std::string& name) {
    for (const auto& s : samplers())
        if (s.name == name) return s;
    std::vector<std::string> a1111;
    for (const auto& s : samplers()) a1111.push_back("\"" + s.a1111_name + "\"");
    throw Error("unknown sampler '" + name + "' (choose " + sampler_choices() +
                ", or the web UI's name: " + listed(a1111, " or ") + ")");
}

SamplerName parse_sampler_name(const std::string& name) {
    if (const SamplerInfo* s = find_sampler(name)) return {s->name, ""};
    // The web UI 1.6-1.8 named the schedule in the sampler: "DPM++ 2M Karras".
    for (const char* schedule : {"Karras", "Exponential"}) {
        const std::string suffix = std::string(" ") + schedule;
        if (name.size() <= suffix.size() || !same_letters(name.substr(name.size() - suffix.size()), suffix)) continue;
        const std::string base = name.substr(0, name.size() - suffix.size());
        for (const auto& s : samplers())
            if (same_letters(s.a1111_name, base) && s.family == SamplerFamily::k_diffusion)
                return {s.name, schedule_name(schedule)};
    }
    return {name, ""};
}

SamplerName settle_sampler_names(const std::string& sampler, const std::string& schedule, const std::string& current) {
    SamplerName named = parse_sampler_name(sampler);
    const std::string given = schedule_name(schedule);
    if (named.schedule.empty()) {
        named.schedule = schedule.empty() ? schedule_name(current) : given;
    } else if (!schedule.empty() && given != named.schedule) {
        throw Error("--sampler \"" + sampler + "\" names the " + schedule_label(named.schedule) +
                    " schedule, but --schedule says " + schedule);
    }
    return named;
}

std::string schedule_name(const std::string& name) {
    for (const auto& l : kScheduleLabels)
        if (name == l.name || same_letters(name, l.label)) return l.name;
    if (same_letters(name, "SGMUniform")) return "sgm_uniform";  // the web UI's alias
    return name;
}

std::string schedule_label(const std::string& schedule) {
    for (const auto& l : kScheduleLabels)
        if (schedule == l.name) return l.label;
    return schedule;
}

std::string effective_schedule(const std::string& sampler, const std::string& schedule) {
    return schedule == "automatic" ? sampler_info(sampler).automatic_schedule : schedule;
}

void check_sampler_settings(const std::string& sampler, const std::string& schedule) {
    const SamplerInfo& info = sampler_info(sampler);
    if (schedule == "automatic") return;
    std::vector<std::string> takers;  // the samplers taking this schedule
    for (const auto& s : samplers())
        if (std::find(s.schedules.begin(), s.schedules.end(), schedule) != s.schedules.end()) takers.push_back(s.name);
    if (takers.empty()) {
        std::vector<std::string> names, labels;
        for (const auto& l : kScheduleLabels) {
            names.push_back(l.name);
            labels.push_back("\"" + std::string(l.label) + "\"");
        }
        throw Error("unknown schedule '" + schedule + "' (choose " + listed(names, " or ") +
                    ", or the web UI's name: " + listed(labels, " or ") + ")");
    }
    if (std::find(info.schedules.begin(), info.schedules.end(), schedule) == info.schedules.end())
        throw Error("--schedule " + schedule + " applies to " + listed(takers) + " only, not to " + sampler + " (" +
                    sampler + " takes automatic, " + listed(info.schedules, " or ") + ")");
}

double check_beta_parameter(const std::string& what, double v) {
    if (!std::isfinite(v) || v <= 0 || v > 100)
        throw Error(what + " must be more than 0 and at most 100, got " + std::to_string(v));
    return v;
}

void check_brownian_tree(const std::string& mode) {
    if (mode != "a1111" && mode != "kdiffusion")
        throw Error(
            "--brownian-tree must be a1111 (one tree per image, seeded with its seed) or kdiffusion (one "
            "tree for the batch), got \"" +
            mode + "\"");
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
    const SamplerInfo& info = sampler_info(sampler);
    const std::string runs = effective_schedule(sampler, schedule);
    if (info.family == SamplerFamily::k_diffusion)
        return k_schedule_step_count(runs, requested_steps, num_train_timesteps, info.has("discard_penultimate"));
    if (info.family == SamplerFamily::lcm)
        return static_cast<int>(lcm_timesteps(requested_steps, num_train_timesteps).size());
    return static_cast<int>(compvis_timesteps(requested_steps, num_train_timesteps, runs).size());
}

}  // namespace sd
