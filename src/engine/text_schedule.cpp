#include "engine/text_schedule.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <utility>

#include "sd/error.h"
#include "text/prompt_schedule.h"
#include "text/prompt_weights.h"

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

bool composes(const std::vector<std::string>& prompts) {
    for (const auto& p : prompts) {
        const auto parts = composed_parts(p);
        if (parts.size() > 1 || parts[0].weight != 1.0) return true;
    }
    return false;
}

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
                                 bool a1111, int steps, int first_pass_steps) {
    TextSchedule out;
    // The conditional rows: each prompt's parts (A1111's AND), or the prompt itself.
    std::vector<std::string> rows_text;
    for (size_t i = 0; i < prompts.size(); ++i) {
        if (!a1111) {
            rows_text.push_back(prompts[i]);
            continue;
        }
        for (auto& part : composed_parts(prompts[i])) {
            rows_text.push_back(std::move(part.text));
            out.parts.push_back({static_cast<int64_t>(i), part.weight});
        }
    }
    if (out.parts.size() == prompts.size() &&
        std::all_of(out.parts.begin(), out.parts.end(), [](const auto& p) { return p.weight == 1.0; }))
        out.parts.clear();  // one row per image, weight 1: plain guidance
    if (!out.parts.empty() && negatives.empty())
        throw std::logic_error("TextScheduler: composed prompts need the unconditional side");
    // Each distinct text's schedule once: a batch repeats its prompt, and its images share the negative.
    std::map<std::string, std::vector<ScheduledText>> schedules;
    std::vector<const std::vector<ScheduledText>*> rows;  // the conditional rows', then the negatives'
    for (const std::vector<std::string>* side : {&std::as_const(rows_text), &negatives})
        for (const std::string& t : *side) {
            auto it = schedules.find(t);
            if (it == schedules.end())
                it = schedules
                         .emplace(t, a1111 ? prompt_schedule(t, steps, first_pass_steps)
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
            (r < rows_text.size() ? t.first : t.second).push_back(text_at(*rows[r], step));
        return t;
    };
    std::set<Texts> fresh;
    for (int step : changes)
        if (Texts t = texts_at(step); !index_.count(t)) fresh.insert(std::move(t));
    encode_new(std::move(fresh));
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
