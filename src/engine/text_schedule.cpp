#include "engine/text_schedule.h"

#include <set>

#include "sd/error.h"
#include "text/prompt_schedule.h"

namespace sd {

namespace {

// The text of a schedule at `step`: the first entry it has not passed (else the last).
const std::string& text_at(const std::vector<ScheduledText>& schedule, int step) {
    for (const auto& e : schedule)
        if (step <= e.until) return e.text;
    return schedule.back().text;
}

double bytes_of(const UnetConditioning& c) {
    double n = 0;
    for (const at::Tensor* t : {&c.cond, &c.uncond, &c.cond_y, &c.uncond_y})
        if (t->defined()) n += static_cast<double>(t->nbytes());
    return n;
}

}  // namespace

void TextScheduler::encode_new(std::set<Texts> fresh) {
    size_t left = fresh.size();
    auto encode = [&](Texts t) {
        texts_.push_back(encode_(t.first, t.second));
        index_.emplace(std::move(t), texts_.size() - 1);
        --left;
    };
    auto next = [&] { return std::move(fresh.extract(fresh.begin()).value()); };
    if (texts_.empty() && left > 0) {
        encode(next());
        set_bytes_ = bytes_of(texts_[0]);
    }
    // The others cost about what the first did (a longer prompt's more windows, more):
    // checked before any is encoded.
    const size_t total = texts_.size() + left;
    const double extra = static_cast<double>(total - 1) * set_bytes_;
    if (left > 0 && extra > room_)
        throw Error("the prompts' editing and alternation ([FROM:TO:WHEN], [A|B]) make " + std::to_string(total) +
                    " different sets of texts for this batch, which would hold about " +
                    std::to_string(static_cast<long long>(extra / (1 << 20)) + 1) +
                    " MiB beside the model where the memory plan leaves " +
                    std::to_string(static_cast<long long>(room_ / (1 << 20))) +
                    " MiB: use fewer steps or alternatives, a smaller batch, or a larger --max-memory");
    while (left > 0) encode(next());
}

TextSchedule TextScheduler::pass(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 bool scheduling, int steps, int first_pass_steps) {
    // Each distinct text's schedule once: a batch repeats its prompt, and its images share the negative.
    std::map<std::string, std::vector<ScheduledText>> schedules;
    std::vector<const std::vector<ScheduledText>*> rows;  // the prompts', then the negatives'
    for (const auto* side : {&prompts, &negatives})
        for (const std::string& t : *side) {
            auto it = schedules.find(t);
            if (it == schedules.end())
                it = schedules
                         .emplace(t, scheduling ? prompt_schedule(t, steps, first_pass_steps)
                                                : std::vector<ScheduledText>{{steps, t}})
                         .first;
            rows.push_back(&it->second);
        }
    // Every step where some image's prompt or negative changes, and the texts there.
    std::set<int> changes;
    for (const auto* row : rows)
        for (const auto& e : *row) changes.insert(e.until);
    auto texts_at = [&](int step) {
        Texts t;
        for (size_t r = 0; r < rows.size(); ++r)
            (r < prompts.size() ? t.first : t.second).push_back(text_at(*rows[r], step));
        return t;
    };
    std::set<Texts> fresh;
    for (int step : changes)
        if (Texts t = texts_at(step); !index_.count(t)) fresh.insert(std::move(t));
    encode_new(std::move(fresh));
    TextSchedule out;
    std::map<size_t, size_t> local;  // this scheduler's text -> the pass's
    for (int step : changes) {
        const size_t text = index_.at(texts_at(step));
        auto [at, added] = local.emplace(text, out.texts.size());
        if (added) out.texts.push_back(texts_[text]);
        // A call counts from 0 and a step from 1: A1111 compares them as they are.
        if (!out.spans.empty() && out.spans.back().text == at->second)
            out.spans.back().last_call = step;
        else
            out.spans.push_back({step, at->second});
    }
    return out;
}

}  // namespace sd
