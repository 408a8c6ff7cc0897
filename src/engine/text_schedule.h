// A batch's prompts, with A1111's composable prompts (AND and a part's weight,
// text/prompt_weights.h) and its prompt editing and alternation
// (text/prompt_schedule.h), as the text each model call of a pass sees: each
// prompt split into its parts, the parts' and negatives' schedules merged at
// every step where one of them changes, and each distinct set of texts encoded once.
#pragma once
#include <functional>
#include <limits>
#include <map>
#include <set>
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

// Whether some prompt is composed (more than one part, or a weight other than 1): its
// batch needs the unconditional side even at scale 1, as A1111 computes it.
bool composes(const std::vector<std::string>& prompts);

class TextScheduler {
public:
    // Encodes prompts (one per conditional row) and negatives (one per image; none: unguided).
    using EncodeFn = std::function<UnetConditioning(const std::vector<std::string>& prompts,
                                                    const std::vector<std::string>& negatives)>;
    // room: the bytes the texts may hold beyond one set of them (which every memory
    // plan counts); more distinct sets than fit are refused before they are encoded.
    explicit TextScheduler(EncodeFn encode, double room = std::numeric_limits<double>::infinity())
        : encode_(std::move(encode)), room_(room) {}

    // One pass over `steps` (prompt_schedule_steps); first_pass_steps as prompt_schedule's
    // (a hires fix's second pass). Prompts and negatives one per image (negatives empty:
    // unguided, which a composed prompt is not). With A1111's syntax off (--prompt-syntax
    // plain) every text is used as it is. Texts already encoded by this scheduler, for this
    // pass or an earlier one, are not encoded again. Throws sd::Error when the distinct
    // sets would not fit `room`.
    TextSchedule pass(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives, bool a1111,
                      int steps, int first_pass_steps = 0);

private:
    using Texts = std::pair<std::vector<std::string>, std::vector<std::string>>;  // prompts, negatives
    // Encodes sets not encoded yet, after checking they fit room_.
    void encode_new(std::set<Texts> fresh);
    EncodeFn encode_;
    double room_, set_bytes_ = 0;  // set_bytes_: the first set's, the measure of the others
    std::vector<UnetConditioning> texts_;
    std::map<Texts, size_t> index_;
};

}  // namespace sd
