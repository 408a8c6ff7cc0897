// The samplers the tool has (their list: src/sampling/sampler_list.h).
#pragma once
#include <string>
#include <vector>

namespace sd {

enum class SamplerFamily {
    compvis,      // CompVis PLMS/DDIM timesteps: range(0, T, T / steps) + 1
    k_diffusion,  // k-diffusion sigmas (--schedule), exactly --steps steps
};

struct SamplerInfo {
    std::string name;        // --sampler, JSONL "sampler"
    std::string a1111_name;  // the PNG's "Sampler:" field
    SamplerFamily family;
};

// In the list's order; the first is the default (CompVis's --plms).
const std::vector<SamplerInfo>& samplers();
const std::string& default_sampler();

// The row of a name; throws sd::Error naming the choices for an unknown one.
const SamplerInfo& sampler_info(const std::string& name);

// The names, "a, b or c", for help and messages.
std::string sampler_choices();

// Throws sd::Error (one line naming the choices) for an unknown sampler or
// schedule, or a schedule of the other family (karras for PLMS/DDIM; leading or
// trailing, the CompVis timestep spacings, for a k-diffusion sampler).
void check_sampler_settings(const std::string& sampler, const std::string& schedule);

// Steps a sampler really runs for a requested count on a T-step schedule
// (CompVis: 30 -> 31). Throws sd::Error when the count cannot run.
int sampler_step_count(const std::string& sampler, int requested_steps, int num_train_timesteps);

}  // namespace sd
