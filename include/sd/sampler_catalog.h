// The samplers the tool has (their list: src/core/sampler_list.h).
#pragma once
#include <string>
#include <vector>

namespace sd {

enum class SamplerFamily {
    compvis,      // CompVis PLMS/DDIM timesteps: range(0, T, T / steps) + 1
    k_diffusion,  // k-diffusion sigmas (--schedule), exactly --steps steps (the DDIM schedule may run one more)
    lcm,          // diffusers' LCMScheduler: timesteps of a 50-step grid, exactly --steps (1 to 50)
};

struct SamplerInfo {
    std::string name;        // --sampler, JSONL "sampler"
    std::string a1111_name;  // the PNG's "Sampler:" field (--sampler takes it too)
    SamplerFamily family;
    std::vector<std::string> schedules;  // the --schedule values it takes besides "automatic"; "default" first
    std::string automatic_schedule;      // what "automatic" (the web UI's "Automatic") runs for it
    std::vector<std::string> options;    // discard_penultimate, eta, brownian, second_order (core/sampler_list.h)
    bool has(const std::string& option) const;
};

// In the list's order; the first is the default (CompVis's --plms).
const std::vector<SamplerInfo>& samplers();
const std::string& default_sampler();

// The row of a (short) name; throws sd::Error naming the choices for an unknown one.
const SamplerInfo& sampler_info(const std::string& name);

// The names, "a, b or c", for help and messages.
std::string sampler_choices();

// What a --sampler value names: the short name, "k_" + it (the web UI's
// aliases), the web UI's name ("DPM++ 2M SDE", "Euler a"), or the web UI
// 1.6-1.8 name with its schedule ("DPM++ 2M Karras", "DPM++ 2M SDE Heun
// Exponential"), which sets `schedule` too. Anything else comes back
// unchanged with no schedule (check_sampler_settings then names the choices).
struct SamplerName {
    std::string sampler;   // a short name, or the unknown text
    std::string schedule;  // a short schedule name; empty: the name says none
};
SamplerName parse_sampler_name(const std::string& name);

// The steps A1111 schedules its prompt editing over (src/text/prompt_schedule.h):
// its model calls, `steps`, twice that for the samplers it counts two calls a step
// for (the second_order option: Heun, DPM2, DPM2 a, DPM++ 2S a, DPM++ SDE).
int prompt_schedule_steps(const std::string& sampler, int steps);

// A --sampler value and a --schedule value (empty: not given, `current`
// stays) as short names. Throws sd::Error when an old combined name
// ("DPM++ 2M Karras") and a given schedule disagree.
SamplerName settle_sampler_names(const std::string& sampler, const std::string& schedule, const std::string& current);

// A --schedule value's short name: the short name itself or the web UI's
// label ("Karras", "Align Your Steps", "SGMUniform", "Automatic"). Anything
// else comes back unchanged (check_sampler_settings names the choices).
std::string schedule_name(const std::string& name);
// The web UI's "Schedule type" label of a short schedule name ("default" -> "Uniform").
std::string schedule_label(const std::string& schedule);
// The schedule that runs: "automatic" is the sampler's own (its row's), anything else itself.
std::string effective_schedule(const std::string& sampler, const std::string& schedule);

// Throws sd::Error (one line naming the choices) for an unknown sampler or
// schedule, or a schedule the sampler does not take (its row's schedules:
// karras for PLMS/DDIM, trailing for DPM++ 2M, any but
// default for LCM). Names are the short ones (parse_sampler_name, schedule_name).
void check_sampler_settings(const std::string& sampler, const std::string& schedule);

// The same, and the step counts no model can give this sampler (LCM: more than
// its 50 origin steps, as diffusers refuses them). Needs no model.
void check_sampler_settings(const std::string& sampler, const std::string& schedule, int steps);

// The Beta schedule's alpha or beta: v itself when finite and 0 < v <= 100
// (the web UI's default is 0.6); otherwise throws sd::Error naming `what`.
double check_beta_parameter(const std::string& what, double v);

// --brownian-tree: a1111 or kdiffusion; throws sd::Error otherwise.
void check_brownian_tree(const std::string& mode);

// LCM's origin grid: diffusers' LCMScheduler original_inference_steps.
constexpr int kLcmOriginSteps = 50;

// Steps a sampler really runs for a requested count on a T-step schedule
// (CompVis: 30 -> 31). Throws sd::Error when the count cannot run.
int sampler_step_count(const std::string& sampler, int requested_steps, int num_train_timesteps);

}  // namespace sd
