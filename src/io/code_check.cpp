#include "io/code_check.h"

#include <unordered_set>
#include <utility>
#include <vector>

namespace sd {

namespace {

constexpr const char* kListed[] = {
#include "io/op_allowlist.inc"
};

const std::unordered_set<std::string_view>& listed() {
    static const std::unordered_set<std::string_view> set(std::begin(kListed), std::end(kListed));
    return set;
}

bool word_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool word_char(char c) { return word_start(c) || (c >= '0' && c <= '9'); }
bool space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v' || c == '\\'; }

// Class names TorchScript makes up (numbered per export): accepted without a list entry.
bool mangled(std::string_view w) {
    constexpr std::string_view prefix = "___torch_mangle_";
    if (w.size() <= prefix.size() || w.substr(0, prefix.size()) != prefix) return false;
    for (char c : w.substr(prefix.size()))
        if (c < '0' || c > '9') return false;
    return true;
}

struct Chain {
    std::string_view head;  // empty: the first dot follows a bracket, quote or number
    std::vector<std::string_view> rest;
};

// Words, dots and everything else, as scripts/gen_op_allowlist.py's chains(): no notion
// of strings or comments, so a name in either is read like code and the check never
// depends on agreeing with TorchScript's lexer about where a string ends.
std::vector<Chain> chains(std::string_view text) {
    std::vector<Chain> out;
    long chain = -1;  // index into out of the chain the last word belongs to
    bool after_dot = false, last_word = false;
    size_t i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if (space(c)) {
            ++i;
            continue;
        }
        if (word_char(c)) {
            size_t j = i;
            while (j < text.size() && word_char(text[j])) ++j;
            const std::string_view w = text.substr(i, j - i);
            i = j;
            if (!word_start(c)) {
                // A number keeps a dot that ends it ("2." before a line break is a float, not
                // an attribute access); a dot before a letter is read as an attribute access.
                if (i < text.size() && text[i] == '.' && !(i + 1 < text.size() && word_start(text[i + 1]))) ++i;
                chain = -1, after_dot = false, last_word = false;
                continue;
            }
            if (after_dot) {
                if (chain < 0) {
                    out.push_back({});
                    chain = static_cast<long>(out.size()) - 1;
                }
                out[chain].rest.push_back(w);
            } else {
                out.push_back({w, {}});
                chain = static_cast<long>(out.size()) - 1;
            }
            after_dot = false, last_word = true;
            continue;
        }
        if (c == '.') {
            if (!last_word) chain = -1;
            after_dot = true, last_word = false;
        } else {
            chain = -1, after_dot = false, last_word = false;
        }
        ++i;
    }
    return out;
}

std::string written(const Chain& c) {
    std::string s(c.head);
    for (auto r : c.rest) (s += '.') += r;
    return s;
}

// What a chain names that is refused: an unlisted operation (torch.X, ops.NS.X) or torch
// or ops used as a value (first), else an unlisted name after a dot (second).
std::pair<std::string, std::string> refused_in_chain(const Chain& c) {
    size_t k = 0;
    if (c.head == "torch") {
        while (k < c.rest.size() && c.rest[k] == "autograd") ++k;  // torch.autograd.X is aten::X too
        if (k == c.rest.size()) return {written(c), ""};
        const std::string op = "torch." + std::string(c.rest[k++]);
        if (!listed().count(op)) return {op, ""};
    } else if (c.head == "ops") {
        if (c.rest.size() < 2) return {written(c), ""};
        const std::string op = "ops." + std::string(c.rest[0]) + "." + std::string(c.rest[1]);
        if (!listed().count(op)) return {op, ""};
        k = 2;
    }
    // Every other name after a dot is listed too, __torch__ paths included: the archive's
    // own classes (__torch__.sd_modules.UNetModel), where LibTorch's custom C++ classes
    // (__torch__.torch.classes.*) are never listed.
    for (; k < c.rest.size(); ++k) {
        if (mangled(c.rest[k])) continue;
        const std::string attr = "." + std::string(c.rest[k]);
        if (!listed().count(attr)) return {"", attr};
    }
    return {"", ""};
}

// getattr/hasattr name an attribute by a string; only the exports' form, a module list
// index (getattr(blocks, "0")), is accepted.
std::string refused_getattr(std::string_view text) {
    for (std::string_view word : {"getattr", "hasattr"}) {
        for (size_t at = text.find(word); at != std::string_view::npos; at = text.find(word, at + 1)) {
            const size_t end = at + word.size();
            if ((at > 0 && word_char(text[at - 1])) || (end < text.size() && word_char(text[end]))) continue;
            size_t i = end;
            auto blanks = [&] {
                while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
            };
            auto take = [&](char ch) {
                if (i < text.size() && text[i] == ch) return ++i, true;
                return false;
            };
            bool ok = (blanks(), take('(')) && (blanks(), i < text.size() && word_start(text[i]));
            while (ok && i < text.size() && word_char(text[i])) ++i;
            ok = ok && (blanks(), take(',')) && (blanks(), take('"'));
            const size_t digits = i;
            while (ok && i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
            ok = ok && i > digits && take('"') && (blanks(), take(')'));
            if (!ok) {
                std::string_view shown = text.substr(at, 40);
                return std::string(shown.substr(0, shown.find('\n')));
            }
        }
    }
    return "";
}

}  // namespace

bool code_name_listed(std::string_view name) { return listed().count(name) > 0; }

std::string unlisted_code_name(std::string_view code) {
    // An unlisted operation is the most telling name to report, so it wins over an
    // attribute or class name met earlier (an unknown class name usually comes first).
    std::string other;
    for (const auto& c : chains(code)) {
        auto [op, name] = refused_in_chain(c);
        if (!op.empty()) return op;
        if (other.empty()) other = name;
    }
    const std::string by_string = refused_getattr(code);
    return by_string.empty() ? other : by_string;
}

}  // namespace sd
