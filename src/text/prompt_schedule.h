// A1111's prompt editing and alternation: the texts a prompt becomes while it
// samples. No LibTorch here.
//
// Editing: [FROM:TO:WHEN] is FROM up to step WHEN and TO after it; [TO:WHEN]
// adds TO after WHEN, [FROM::WHEN] removes FROM after it. WHEN with a decimal
// point is a fraction of the steps (0.5: half of them), without one a step.
// Alternation: [A|B|C] is A at step 1, B at step 2, C at step 3, A again at
// step 4, and so on. Both nest. The rules are those of the web UI's
// modules/prompt_parser.py (get_learned_conditioning_prompt_schedules, its
// default, "new" scheduling); docs/prompts.md says them for users.
#pragma once
#include <string>
#include <vector>

namespace sd {

// One text of a prompt's schedule: it is used up to step `until` (A1111's
// end_at_step), the next one after it.
struct ScheduledText {
    int until = 0;
    std::string text;
};

// The prompt's texts over `steps` steps, in step order, the last one until
// `steps`: one entry with the prompt unchanged when it has no editing or
// alternation (or does not parse by A1111's grammar, which then leaves it as it
// is: a '|' outside brackets, a trailing '\'), or has more than
// kMaxScheduleDepth brackets open at once, closed or not (bounded recursion).
// Every other bracket and character comes out as it was written, for the
// weighting parser (prompt_weights.h) to read.
//
// first_pass_steps: for a hires fix's second pass, the first pass's steps, and
// `steps` the second pass's: a WHEN without a decimal point then counts on from
// the first pass's steps, and a fraction from 1 (1.5: half of the second pass;
// 0.5: before the second pass starts). 0 for a first pass.
//
// Throws sd::Error when the texts would take more than kMaxScheduleBytes (a
// prompt of thousands of bytes alternating over hundreds of steps): they are
// held while the batch's text is encoded.
std::vector<ScheduledText> prompt_schedule(const std::string& prompt, int steps, int first_pass_steps = 0);

constexpr size_t kMaxScheduleBytes = size_t{8} << 20;

// More brackets open at once than this leave a prompt as it is written.
constexpr int kMaxScheduleDepth = 200;

}  // namespace sd
