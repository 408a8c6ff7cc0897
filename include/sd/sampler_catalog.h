// The samplers the tool has (their list: src/core/sampler_list.h).
#pragma once
#include <string>
#include <vector>

namespace sd {

enum class SamplerFamily {
    compvis,      // CompVis PLMS/DDIM timesteps: range(0, T, T / steps) + 1
    k_diffusion,  // k-diffusion sigmas (--schedule), exactly --steps steps
    lcm,          // diffusers' LCMScheduler: timesteps of a 50-step grid, exactly --steps (1 to 50)
};

struct SamplerInfo {
    std::string name;        // --sampler, JSONL "sampler"
    std::string a1111_name;  // the PNG's "Sampler:" field
    SamplerFamily family;
    std::vector<std::string> schedules;  // the --schedule values it takes; "default" first
};

// In the list's order; the first is the default (CompVis's --plms).
const std::vector<SamplerInfo>& samplers();
const std::string& default_sampler();

// The row of a name; throws sd::Error naming the choices for an unknown one.
const SamplerInfo& sampler_info(const std::string& name);

// The names, "a, b or c", for help and messages.
std::string sampler_choices();

// Throws sd::Error (one line naming the choices) for an unknown sampler or
// schedule, or a schedule the sampler does not take (its row's schedules:
// karras for PLMS/DDIM, trailing for DPM++ 2M, any but
// default for LCM).
void check_sampler_settings(const std::string& sampler, const std::string& schedule);

// The same, and the step counts no model can give this sampler (LCM: more than
// its 50 origin steps, as diffusers refuses them). Needs no model.
void check_sampler_settings(const std::string& sampler, const std::string& schedule, int steps);

// LCM's origin grid: diffusers' LCMScheduler original_inference_steps.
constexpr int kLcmOriginSteps = 50;

// Steps a sampler really runs for a requested count on a T-step schedule
// (CompVis: 30 -> 31). Throws sd::Error when the count cannot run.
int sampler_step_count(const std::string& sampler, int requested_steps, int num_train_timesteps);

}  // namespace sd
