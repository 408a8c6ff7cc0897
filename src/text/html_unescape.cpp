#include "text/html_unescape.h"

#include <string_view>
#include <unordered_map>

namespace sd {
namespace {

struct Entity {
    const char* name;
    const char32_t* value;
};

const Entity kEntities[] = {
#include "text/html_entities.inc"
};

const std::unordered_map<std::string, std::u32string>& entities() {
    static const auto table = [] {
        std::unordered_map<std::string, std::u32string> m;
        for (const Entity& e : kEntities) m.emplace(e.name, e.value);
        return m;
    }();
    return table;
}

// Python's html._invalid_charrefs: references to C1 controls read as Windows-1252.
const char32_t kWindows1252[32] = {0x20AC, 0x81,   0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                   0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x8D,   0x017D, 0x8F,
                                   0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                   0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D,   0x017E, 0x0178};

std::u32string numeric(unsigned long long num) {
    if (num == 0) return U"\uFFFD";
    if (num == 0x0D) return U"\r";
    if (num >= 0x80 && num <= 0x9F) return std::u32string(1, kWindows1252[num - 0x80]);
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return U"\uFFFD";
    // html._invalid_codepoints: removed
    if ((num >= 0x01 && num <= 0x08) || num == 0x0B || (num >= 0x0E && num <= 0x1F) || num == 0x7F ||
        (num >= 0xFDD0 && num <= 0xFDEF) || (num & 0xFFFE) == 0xFFFE)
        return U"";
    return std::u32string(1, static_cast<char32_t>(num));
}

bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_hex(char32_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
int hex_value(char32_t c) { return is_digit(c) ? int(c - '0') : int((c | 0x20) - 'a' + 10); }

}  // namespace

// The reference's regex: &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)
std::u32string html_unescape(const std::u32string& t) {
    if (t.find(U'&') == std::u32string::npos) return t;
    std::u32string out;
    size_t i = 0;
    while (i < t.size()) {
        if (t[i] != U'&') {
            out.push_back(t[i++]);
            continue;
        }
        size_t j = i + 1;
        if (j < t.size() && t[j] == U'#') {
            const bool hex = j + 1 < t.size() && (t[j + 1] == U'x' || t[j + 1] == U'X');
            size_t k = j + (hex ? 2 : 1), start = k;
            unsigned long long num = 0;
            while (k < t.size() && (hex ? is_hex(t[k]) : is_digit(t[k]))) {
                num = num * (hex ? 16 : 10) + static_cast<unsigned long long>(hex ? hex_value(t[k]) : int(t[k] - '0'));
                if (num > 0x10FFFF) num = 0x110000;  // any larger number gives the same U+FFFD
                ++k;
            }
            if (k == start) {  // "&#" not followed by digits: no reference
                out.push_back(t[i++]);
                continue;
            }
            if (k < t.size() && t[k] == U';') ++k;
            out += numeric(num);
            i = k;
            continue;
        }
        // A name: up to 32 characters other than \t \n \f space < & # ;, then an optional ';'.
        size_t k = j;
        while (k < t.size() && k - j < 32) {
            char32_t c = t[k];
            if (c == U'\t' || c == U'\n' || c == U'\f' || c == U' ' || c == U'<' || c == U'&' || c == U'#' || c == U';')
                break;
            ++k;
        }
        if (k == j) {
            out.push_back(t[i++]);
            continue;
        }
        if (k < t.size() && t[k] == U';') ++k;
        const std::u32string name(t, j, k - j);
        // Entity names are ASCII: other characters become \x01, which no name contains.
        std::string key;
        for (char32_t c : name) key.push_back(c < 0x80 ? static_cast<char>(c) : '\x01');
        const auto& table = entities();
        auto it = table.find(key);
        if (it != table.end()) {
            out += it->second;
        } else {
            // The longest prefix (of at least 2 characters) that is a name, as the standard says.
            bool found = false;
            for (size_t x = name.size() - 1; x > 1; --x) {
                auto p = table.find(key.substr(0, x));
                if (p != table.end()) {
                    out += p->second;
                    out.append(name, x, std::u32string::npos);
                    found = true;
                    break;
                }
            }
            if (!found) {
                out.push_back(U'&');
                out += name;
            }
        }
        i = k;
    }
    return out;
}

}  // namespace sd
