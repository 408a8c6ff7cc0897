// A batch's prompts, with A1111's prompt editing and alternation
// (text/prompt_schedule.h), as the text each model call of a pass sees: the
// images' schedules (prompts and negatives) merged at every step where one of
// them changes, and each distinct set of texts encoded once.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/guidance.h"

namespace sd {

// A pass to schedule: its steps (prompt_schedule_steps, sd/sampler_catalog.h), and for a hires fix's second
// pass the first pass's (0 otherwise).
struct TextPass {
    int steps;
    int first_pass_steps = 0;
};

class TextScheduler {
public:
    // Encodes one text per image for each side (negatives empty: unguided).
    using EncodeFn = std::function<UnetConditioning(const std::vector<std::string>& prompts,
                                                    const std::vector<std::string>& negatives)>;
    explicit TextScheduler(EncodeFn encode) : encode_(std::move(encode)) {}

    // One pass over `steps` (prompt_schedule_steps); first_pass_steps as prompt_schedule's
    // (a hires fix's second pass). With scheduling off (--prompt-syntax plain) every
    // text is used as it is. Texts already encoded by this scheduler, for this
    // pass or an earlier one, are not encoded again.
    TextSchedule pass(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                      bool scheduling, int steps, int first_pass_steps = 0);

private:
    EncodeFn encode_;
    std::vector<UnetConditioning> texts_;
    std::map<std::pair<std::vector<std::string>, std::vector<std::string>>, size_t> index_;
};

}  // namespace sd
