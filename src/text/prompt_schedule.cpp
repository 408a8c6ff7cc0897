#include "text/prompt_schedule.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include "sd/error.h"

namespace sd {

namespace {

// The prompt as A1111's schedule grammar reads it. Nodes live in one vector and
// refer to each other by index.
struct Node {
    enum Kind { text, sequence, edit, alternation } kind = text;
    std::string literal;     // text: as written
    std::vector<int> parts;  // sequence: its parts; alternation: its options; edit: {FROM or -1, TO}
    std::string when;        // edit: WHEN as written
    int step = 0;            // edit: the step it changes after
};

struct DoesNotParse {};  // A1111's grammar rejects the whole prompt
struct TooDeep {};       // more than kMaxScheduleDepth brackets open at once

// Python's \s on ASCII (the grammar's WHITESPACE around WHEN).
bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || (c >= 0x1c && c <= 0x1f);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The end of lark's SIGNED_NUMBER at i (the longest match), or i when there is none.
size_t number_end(const std::string& s, size_t i) {
    const size_t from = i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    const size_t int_from = i;
    while (i < s.size() && is_digit(s[i])) ++i;
    bool digits = i > int_from;
    if (i < s.size() && s[i] == '.') {
        size_t j = i + 1;
        while (j < s.size() && is_digit(s[j])) ++j;
        if (digits || j > i + 1) {
            digits = true;
            i = j;
        }
    }
    if (!digits) return from;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
        const size_t exp_from = j;
        while (j < s.size() && is_digit(s[j])) ++j;
        if (j > exp_from) i = j;
    }
    return i;
}

// Recursive descent over the grammar (the web UI parses it with lark's Earley
// parser). Inside a bracket everything must parse; at the top a bracket that
// does not is literal text, as the grammar's start rule allows. A bracket
// parses the same wherever it is met, so each one is parsed once (memo_) and
// a prompt of many unclosed brackets stays linear; recursion stops at
// kMaxScheduleDepth brackets open at once.
class ScheduleParser {
public:
    explicit ScheduleParser(const std::string& s) : s_(s) {}
    std::vector<Node> nodes;

    // The whole prompt; throws DoesNotParse or TooDeep.
    int parse() {
        const auto [node, end] = sequence(0, 0, true);
        (void)end;
        return node;
    }

private:
    struct Parsed {
        int node;  // -1: no bracket starts here
        size_t end;
    };

    int add(Node n) {
        nodes.push_back(std::move(n));
        return static_cast<int>(nodes.size()) - 1;
    }
    int literal(std::string text) {
        Node n;
        n.literal = std::move(text);
        return add(std::move(n));
    }

    // Text and brackets from i up to a character that ends it here: inside a
    // bracket ] ) : | or the end; at the top only the end (']', ')' and ':' are
    // literal there; a '|' fails the prompt).
    Parsed sequence(size_t i, int depth, bool top) {
        Node seq;
        seq.kind = Node::sequence;
        std::string text;
        auto flush = [&] {
            if (!text.empty()) seq.parts.push_back(literal(std::move(text)));
            text.clear();
        };
        while (i < s_.size()) {
            const char c = s_[i];
            if (c == '\\') {
                // The grammar's escape is '\' and any character but a newline (its regex '.').
                if (i + 1 == s_.size() || s_[i + 1] == '\n') {
                    if (top) throw DoesNotParse{};
                    break;
                }
                text.append(s_, i, 2);
                i += 2;
            } else if (c == '[' || c == '(') {
                const Parsed b = bracket(i, depth + 1);
                if (b.node >= 0) {
                    flush();
                    seq.parts.push_back(b.node);
                    i = b.end;
                } else if (top) {
                    text += c;
                    ++i;
                } else {
                    break;
                }
            } else if (c == ']' || c == ')' || c == ':') {
                if (!top) break;
                text += c;
                ++i;
            } else if (c == '|') {
                if (top) throw DoesNotParse{};
                break;
            } else {
                text += c;
                ++i;
            }
        }
        flush();
        return {add(std::move(seq)), i};
    }

    // [WS] NUMBER [WS] ']' at i: the end past ']', the number in *when; 0 when not.
    size_t when_close(size_t i, std::string* when) const {
        while (i < s_.size() && is_space(s_[i])) ++i;
        const size_t e = number_end(s_, i);
        if (e == i) return 0;
        size_t j = e;
        while (j < s_.size() && is_space(s_[j])) ++j;
        if (j >= s_.size() || s_[j] != ']') return 0;
        *when = s_.substr(i, e - i);
        return j + 1;
    }

    Parsed bracket(size_t at, int depth) {
        if (const auto m = memo_.find(at); m != memo_.end()) return m->second;
        if (depth > kMaxScheduleDepth) throw TooDeep{};
        const Parsed parsed = parse_bracket(at, depth);
        memo_[at] = parsed;
        return parsed;
    }

    Parsed parse_bracket(size_t at, int depth) {
        constexpr Parsed none{-1, 0};
        const char open = s_[at];
        const Parsed first = sequence(at + 1, depth, false);
        size_t j = first.end;
        if (j >= s_.size()) return none;
        auto verbatim = [&](std::vector<int> parts, size_t end) {
            Node n;
            n.kind = Node::sequence;
            n.parts = std::move(parts);
            return Parsed{add(std::move(n)), end};
        };
        if (open == '(') {
            // Emphasis, (A) or (A:B): written as it is, with what is inside scheduled.
            if (s_[j] == ')') return verbatim({literal("("), first.node, literal(")")}, j + 1);
            if (s_[j] != ':') return none;
            const Parsed second = sequence(j + 1, depth, false);
            if (second.end >= s_.size() || s_[second.end] != ')') return none;
            return verbatim({literal("("), first.node, literal(":"), second.node, literal(")")}, second.end + 1);
        }
        if (s_[j] == ']') return verbatim({literal("["), first.node, literal("]")}, j + 1);
        if (s_[j] == '|') {
            Node alt;
            alt.kind = Node::alternation;
            alt.parts.push_back(first.node);
            while (j < s_.size() && s_[j] == '|') {
                const Parsed option = sequence(j + 1, depth, false);
                alt.parts.push_back(option.node);
                j = option.end;
            }
            if (j >= s_.size() || s_[j] != ']') return none;
            return {add(std::move(alt)), j + 1};
        }
        if (s_[j] != ':') return none;
        Node edit;
        edit.kind = Node::edit;
        // [TO:WHEN], else [FROM:TO:WHEN].
        if (const size_t end = when_close(j + 1, &edit.when)) {
            edit.parts = {-1, first.node};
            return {add(std::move(edit)), end};
        }
        const Parsed to = sequence(j + 1, depth, false);
        if (to.end >= s_.size() || s_[to.end] != ':') return none;
        const size_t end = when_close(to.end + 1, &edit.when);
        if (!end) return none;
        edit.parts = {first.node, to.node};
        return {add(std::move(edit)), end};
    }

    const std::string& s_;
    std::unordered_map<size_t, Parsed> memo_;
};

// WHEN as a step: with a decimal point a fraction of `steps` (from 1 in a second
// pass), else a step (counted on from the first pass's steps in a second pass);
// truncated toward zero and at most `steps`, as Python's min(steps, int(v)).
int when_step(const std::string& when, int steps, int first_pass_steps) {
    const char* from = when.data() + (when[0] == '+' ? 1 : 0);
    double v = 0;
    const auto [ptr, ec] = std::from_chars(from, when.data() + when.size(), v);
    (void)ptr;
    if (ec == std::errc::result_out_of_range) {
        const size_t e = when.find_first_of("eE");
        const bool tiny = e != std::string::npos && e + 1 < when.size() && when[e + 1] == '-';
        v = tiny ? 0.0 : (when[0] == '-' ? -1.0 : 1.0) * std::numeric_limits<double>::infinity();
    }
    const bool fraction = when.find('.') != std::string::npos;
    v = fraction ? (v - (first_pass_steps ? 1.0 : 0.0)) * steps : v - first_pass_steps;
    if (!(v < steps)) return steps;
    if (v < -1e9) return -1000000000;  // never: any step is after it
    return static_cast<int>(std::trunc(v));
}

// The steps at which some text changes (each edit's WHEN of at least 1; every
// step under an alternation), and whether the prompt has an edit or alternation at all.
struct Changes {
    std::set<int> at;
    bool edits = false, alternates = false;
};

void collect(std::vector<Node>& nodes, int n, int steps, int first_pass_steps, Changes& c) {
    if (n < 0) return;
    Node& node = nodes[static_cast<size_t>(n)];
    if (node.kind == Node::edit) {
        c.edits = true;
        node.step = when_step(node.when, steps, first_pass_steps);
        if (node.step >= 1) c.at.insert(node.step);
    }
    if (node.kind == Node::alternation) c.alternates = true;
    for (int p : node.parts) collect(nodes, p, steps, first_pass_steps, c);
}

void text_at(const std::vector<Node>& nodes, int n, int step, std::string& out) {
    if (n < 0) return;
    const Node& node = nodes[static_cast<size_t>(n)];
    switch (node.kind) {
        case Node::text:
            out += node.literal;
            break;
        case Node::sequence:
            for (int p : node.parts) text_at(nodes, p, step, out);
            break;
        case Node::edit:
            text_at(nodes, step <= node.step ? node.parts[0] : node.parts[1], step, out);
            break;
        case Node::alternation:
            text_at(nodes, node.parts[static_cast<size_t>(step - 1) % node.parts.size()], step, out);
            break;
    }
}

}  // namespace

std::vector<ScheduledText> prompt_schedule(const std::string& prompt, int steps, int first_pass_steps) {
    const std::vector<ScheduledText> unchanged = {{steps, prompt}};
    if (steps < 1 || prompt.find('[') == std::string::npos) return unchanged;
    ScheduleParser parser(prompt);
    int root = -1;
    try {
        root = parser.parse();
    } catch (const DoesNotParse&) {
        return unchanged;
    } catch (const TooDeep&) {
        return unchanged;
    }
    Changes changes;
    changes.at.insert(steps);
    collect(parser.nodes, root, steps, first_pass_steps, changes);
    if (!changes.edits && !changes.alternates) return unchanged;
    if (changes.alternates)
        for (int s = 1; s <= steps; ++s) changes.at.insert(s);
    // Each text is at most the prompt's length.
    if (changes.at.size() * prompt.size() > kMaxScheduleBytes)
        throw Error("its editing and alternation make " + std::to_string(changes.at.size()) + " texts of up to " +
                    std::to_string(prompt.size()) + " bytes over " + std::to_string(steps) + " steps, more than " +
                    std::to_string(kMaxScheduleBytes >> 20) +
                    " MiB of text to hold; use fewer steps, or a shorter prompt with fewer alternations");
    std::vector<ScheduledText> out;
    for (int step : changes.at) {
        std::string text;
        text_at(parser.nodes, root, step, text);
        out.push_back({step, std::move(text)});
    }
    return out;
}

}  // namespace sd
