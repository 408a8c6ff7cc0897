#include "text/prompt_weights.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "sd/error.h"
#include "sd/tokenizer.h"

namespace sd {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
// A word character next to BREAK keeps it from being the keyword ("BREAKfast").
// Bytes of multi-byte UTF-8 characters count as word characters.
bool is_word(char c) {
    auto u = static_cast<unsigned char>(c);
    return (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' || u >= 0x80;
}
bool is_syntax(char c) { return c == '\\' || c == '(' || c == ')' || c == '[' || c == ']' || c == ':'; }

// A run of plain text, split at BREAK keywords (with the whitespace around them).
void add_text(std::vector<WeightedText>& out, const std::string& run) {
    size_t start = 0;
    for (size_t i = 0; i + 5 <= run.size();) {
        const bool keyword = run.compare(i, 5, "BREAK") == 0 && (i == 0 || !is_word(run[i - 1])) &&
                             (i + 5 == run.size() || !is_word(run[i + 5]));
        if (!keyword) {
            ++i;
            continue;
        }
        size_t before = i, after = i + 5;
        while (before > start && is_space(run[before - 1])) --before;
        while (after < run.size() && is_space(run[after])) ++after;
        out.push_back({run.substr(start, before - start), 1.0, false});
        out.push_back({"", 1.0, true});
        start = i = after;
    }
    out.push_back({run.substr(start), 1.0, false});
}

// At p[i] == ':', the weight token ":" spaces number spaces ")" (number: [+-]?[.0-9]+).
// Returns its length (0 if there is none) and the number's text.
size_t weight_token(const std::string& p, size_t i, std::string& number) {
    size_t j = i + 1;
    while (j < p.size() && is_space(p[j])) ++j;
    const size_t start = j;
    if (j < p.size() && (p[j] == '+' || p[j] == '-')) ++j;
    const size_t digits = j;
    while (j < p.size() && ((p[j] >= '0' && p[j] <= '9') || p[j] == '.')) ++j;
    if (j == digits) return 0;
    number = p.substr(start, j - start);
    while (j < p.size() && is_space(p[j])) ++j;
    return j < p.size() && p[j] == ')' ? j + 1 - i : 0;
}

bool parse_number(const std::string& s, double& value) {
    char* end = nullptr;
    value = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size() && s.find_first_of("0123456789") != std::string::npos;
}

}  // namespace

std::vector<WeightedText> parse_prompt_weights(const std::string& p) {
    std::vector<WeightedText> res;
    std::vector<size_t> round, square;  // where each open bracket's text starts in res
    auto multiply = [&](size_t from, double m) {
        for (size_t k = from; k < res.size(); ++k)
            if (!res[k].is_break) res[k].weight *= m;
    };
    const double round_mult = 1.1, square_mult = 1 / 1.1;
    size_t i = 0;
    while (i < p.size()) {
        const char c = p[i];
        if (c == '\\') {
            // \( \) \[ \] \\ are the character itself; a lone backslash is dropped.
            if (i + 1 < p.size() && std::strchr("()[]\\", p[i + 1]) && p[i + 1] != '\0') {
                res.push_back({std::string(1, p[i + 1]), 1.0, false});
                i += 2;
            } else {
                i += 1;
            }
        } else if (c == '(') {
            round.push_back(res.size());
            ++i;
        } else if (c == '[') {
            square.push_back(res.size());
            ++i;
        } else if (c == ':') {
            std::string number;
            const size_t len = weight_token(p, i, number);
            double w = 0;
            if (len && !round.empty() && parse_number(number, w)) {
                multiply(round.back(), w);
                round.pop_back();
                i += len;
            } else if (len) {
                add_text(res, p.substr(i, len));  // ":1.2)" with no bracket open: text
                i += len;
            } else {
                add_text(res, ":");
                ++i;
            }
        } else if (c == ')' || c == ']') {
            auto& open = c == ')' ? round : square;
            if (open.empty()) {
                add_text(res, std::string(1, c));
            } else {
                multiply(open.back(), c == ')' ? round_mult : square_mult);
                open.pop_back();
            }
            ++i;
        } else {
            size_t j = i;
            while (j < p.size() && !is_syntax(p[j])) ++j;
            add_text(res, p.substr(i, j - i));
            i = j;
        }
    }
    // Unclosed brackets reach to the end of the prompt.
    for (size_t pos : round) multiply(pos, round_mult);
    for (size_t pos : square) multiply(pos, square_mult);

    std::vector<WeightedText> merged;
    for (auto& r : res) {
        if (!merged.empty() && !r.is_break && !merged.back().is_break && merged.back().weight == r.weight)
            merged.back().text += r.text;
        else
            merged.push_back(std::move(r));
    }
    if (merged.empty()) merged.push_back({"", 1.0, false});
    return merged;
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A1111's re_weight on one part: ^(.*?)(?:\s*:\s*([-+]?(?:\d+\.?|\d*\.\d+)))?\s*$.
ComposedPart weighed(const std::string& part) {
    size_t end = part.size();
    while (end > 0 && is_space(part[end - 1])) --end;
    // The number: digits with at most one point, and digits on at least one side of it.
    size_t from = end;
    bool point = false, digits = false;
    while (from > 0 && (is_digit(part[from - 1]) || (part[from - 1] == '.' && !point))) {
        point = point || part[from - 1] == '.';
        digits = digits || part[from - 1] != '.';
        --from;
    }
    size_t sign = from;
    if (sign > 0 && (part[sign - 1] == '+' || part[sign - 1] == '-')) --sign;
    size_t colon = sign;
    while (colon > 0 && is_space(part[colon - 1])) --colon;
    if (!digits || colon == 0 || part[colon - 1] != ':') return {part.substr(0, end), 1.0};
    size_t text_end = colon - 1;
    while (text_end > 0 && is_space(part[text_end - 1])) --text_end;
    return {part.substr(0, text_end), std::strtod(part.substr(sign, end - sign).c_str(), nullptr)};
}

}  // namespace

std::vector<ComposedPart> composed_parts(const std::string& p) {
    // Python's \b: a word character on one side only (ASCII letters, digits, '_', and any
    // non-ASCII letter, which is_word approximates by the byte).
    std::vector<ComposedPart> out;
    size_t from = 0;
    for (size_t at = p.find("AND"); at != std::string::npos; at = p.find("AND", at + 1))
        if ((at == 0 || !is_word(p[at - 1])) && (at + 3 == p.size() || !is_word(p[at + 3]))) {
            out.push_back(weighed(p.substr(from, at - from)));
            from = at + 3;
        }
    out.push_back(weighed(p.substr(from)));
    return out;
}

void check_prompt_weights(const std::string& prompt, const std::string& what) {
    for (const auto& part : parse_prompt_weights(prompt)) {
        if (part.is_break || std::isfinite(static_cast<float>(part.weight))) continue;
        size_t cut = std::min<size_t>(part.text.size(), 40);
        while (cut < part.text.size() && cut > 0 && (static_cast<unsigned char>(part.text[cut]) & 0xC0) == 0x80) --cut;
        std::string text = part.text.substr(0, cut);  // whole UTF-8 characters
        if (cut < part.text.size()) text += "...";
        throw Error(what + ": the weight of \"" + text +
                    "\" is not a finite number (too many nested brackets, or a weight too large for a float)");
    }
}

bool PromptChunks::weighted() const {
    for (const auto& row : weights)
        for (float w : row)
            if (w != 1.0f) return true;
    return false;
}

PromptChunks tokenize_prompt(const ClipTokenizer& tok, const std::string& prompt, const PromptSyntax& syntax,
                             int context_length, int bos, int eos, int pad, const std::vector<AddedWord>& added) {
    const size_t per_chunk = static_cast<size_t>(context_length) - 2;
    std::vector<WeightedText> parts;
    if (syntax.weighting)
        parts = parse_prompt_weights(prompt);
    else
        parts.push_back({prompt, 1.0, false});

    PromptChunks out;
    std::vector<int64_t> ids;
    std::vector<float> weights;
    auto close_chunk = [&] {
        std::vector<int64_t> row = {bos};
        std::vector<float> w = {1.0f};
        row.insert(row.end(), ids.begin(), ids.end());
        w.insert(w.end(), weights.begin(), weights.end());
        row.push_back(eos);
        row.resize(static_cast<size_t>(context_length), pad);
        w.resize(static_cast<size_t>(context_length), 1.0f);
        out.ids.push_back(std::move(row));
        out.weights.push_back(std::move(w));
        ids.clear();
        weights.clear();
    };
    for (const auto& part : parts) {
        if (part.is_break) {
            close_chunk();
            continue;
        }
        const float weight = static_cast<float>(part.weight);
        for (const auto& piece : split_trigger_words(part.text, added)) {
            if (piece.word < 0) {
                for (int t : tok.encode(piece.text)) {
                    if (ids.size() == per_chunk) close_chunk();
                    ids.push_back(t);
                    weights.push_back(weight);
                }
                continue;
            }
            const AddedWord& w = added[piece.word];
            const bool whole = syntax.long_prompts && static_cast<size_t>(w.count) <= per_chunk;
            if (!ids.empty() && (ids.size() == per_chunk || (whole && ids.size() + w.count > per_chunk))) close_chunk();
            for (int k = 0; k < w.count; ++k) {
                if (ids.size() == per_chunk) close_chunk();
                ids.push_back(w.first_id + k);
                weights.push_back(weight);
            }
        }
    }
    if (!ids.empty() || out.ids.empty()) close_chunk();
    if (!syntax.long_prompts && out.ids.size() > 1) {  // one window: the rest is cut off, as the reference does
        out.ids.resize(1);
        out.weights.resize(1);
    }
    return out;
}

}  // namespace sd
