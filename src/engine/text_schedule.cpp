#include "engine/text_schedule.h"

#include <set>

#include "text/prompt_schedule.h"

namespace sd {

namespace {

// The text of a schedule at `step`: the first entry it has not passed (else the last).
const std::string& text_at(const std::vector<ScheduledText>& schedule, int step) {
    for (const auto& e : schedule)
        if (step <= e.until) return e.text;
    return schedule.back().text;
}

}  // namespace

TextSchedule TextScheduler::pass(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 bool scheduling, int steps, int first_pass_steps) {
    auto schedules = [&](const std::vector<std::string>& texts) {
        std::vector<std::vector<ScheduledText>> out;
        for (const auto& t : texts)
            out.push_back(scheduling ? prompt_schedule(t, steps, first_pass_steps)
                                     : std::vector<ScheduledText>{{steps, t}});
        return out;
    };
    const auto ps = schedules(prompts), ns = schedules(negatives);
    // Every step where some image's prompt or negative changes.
    std::set<int> changes;
    for (const auto* side : {&ps, &ns})
        for (const auto& schedule : *side)
            for (const auto& e : schedule) changes.insert(e.until);
    TextSchedule out;
    std::map<size_t, size_t> local;  // this scheduler's text -> the pass's
    for (int step : changes) {
        std::pair<std::vector<std::string>, std::vector<std::string>> key;
        for (const auto& s : ps) key.first.push_back(text_at(s, step));
        for (const auto& s : ns) key.second.push_back(text_at(s, step));
        auto found = index_.find(key);
        if (found == index_.end()) {
            texts_.push_back(encode_(key.first, key.second));
            found = index_.emplace(std::move(key), texts_.size() - 1).first;
        }
        auto [at, added] = local.emplace(found->second, out.texts.size());
        if (added) out.texts.push_back(texts_[found->second]);
        // A call counts from 0 and a step from 1: A1111 compares them as they are.
        if (!out.spans.empty() && out.spans.back().text == at->second)
            out.spans.back().last_call = step;
        else
            out.spans.push_back({step, at->second});
    }
    return out;
}

}  // namespace sd
