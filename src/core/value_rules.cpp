#include "sd/value_rules.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <thread>

#include "sd/error.h"

namespace sd {

int64_t check_whole(const std::string& what, int64_t v, WholeRange r) {
    if (v < r.lo || v > r.hi)
        throw Error(what + " must be a whole number from " + std::to_string(r.lo) + " to " + std::to_string(r.hi) +
                    ", got " + std::to_string(v));
    return v;
}

double check_scale(const std::string& what, double v) {
    if (!std::isfinite(v) || v < kMinScale || v > kMaxScale) {
        std::ostringstream o;
        o << what << " must be a number from " << kMinScale << " to " << kMaxScale << ", got " << v;
        throw Error(o.str());
    }
    return v;
}

uint64_t parse_seed(const std::string& what, const std::string& text) {
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    bool ok = !text.empty();
    uint64_t v = 0;
    for (char c : text) {
        const uint64_t d = static_cast<uint64_t>(c - '0');
        if (c < '0' || c > '9' || v > (kMax - d) / 10) {
            ok = false;
            break;
        }
        v = v * 10 + d;
    }
    if (!ok) throw Error(what + " must be a whole number from 0 to " + std::to_string(kMax) + ", got \"" + text + "\"");
    return v;
}

int max_threads() {
    // More threads than cores only adds switching; four per core leaves room
    // for machines whose core count the process cannot see.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    return static_cast<int>(std::max(16u, 4 * cores));
}

int check_threads(int64_t threads) {
    if (threads < 0 || threads > max_threads())
        throw Error("--threads must be from 0 (one per usable CPU) to " + std::to_string(max_threads()) +
                    " (four per core on this machine, at least 16), got " + std::to_string(threads));
    return static_cast<int>(threads);
}

void check_clip_skip(const std::string& what, int64_t clip_skip, int text_layers) {
    if (clip_skip < 1)
        throw Error(what + " must be at least 1 (1: every text encoder layer, 2: skip the last one), got " +
                    std::to_string(clip_skip));
    if (text_layers > 0 && clip_skip > text_layers + 1)
        throw Error(what + " " + std::to_string(clip_skip) +
                    " skips more layers than this model's text encoder runs (" + std::to_string(text_layers) +
                    "; the largest clip skip is " + std::to_string(text_layers + 1) + ")");
}

WholePair parse_whole_pair(const std::string& what, const std::string& text, char separator, int64_t lo) {
    const std::string form = separator == 'x' ? "WIDTHxHEIGHT, e.g. 1024x1024" : "TOP,LEFT, e.g. 0,0";
    const size_t at = text.find(separator);
    auto whole = [&](const std::string& part) -> int {
        if (part.empty() || part.size() > 6 || part.find_first_not_of("0123456789") != std::string::npos)
            throw Error(what + " takes two whole numbers, " + form + ", got \"" + text + "\"");
        const int64_t v = std::stoll(part);
        if (v < lo || v > kSideRange.hi)
            throw Error(what + " values must be from " + std::to_string(lo) + " to " + std::to_string(kSideRange.hi) +
                        ", got \"" + text + "\"");
        return static_cast<int>(v);
    };
    if (at == std::string::npos) whole("");
    return {whole(text.substr(0, at)), whole(text.substr(at + 1))};
}

bool is_valid_utf8(const std::string& s) {
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        int len;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else
            return false;
        if (i + static_cast<size_t>(len) > n) return false;
        for (int k = 1; k < len; ++k) {
            const unsigned char cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (cc & 0x3f);
        }
        // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += static_cast<size_t>(len);
    }
    return true;
}

}  // namespace sd
