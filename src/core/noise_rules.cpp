#include "sd/noise_rules.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "sd/error.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

std::string parse_rng(const std::string& text) {
    std::string v;
    for (const char c : text) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v != "cpu" && v != "nv") throw Error("--rng must be cpu or nv, got \"" + text + "\"");
    return v;
}

void parse_seed_resize_from(const std::string& text, NoiseSettings& s) {
    const WholePair p = parse_whole_pair("--seed-resize-from", text, 'x', 8);
    s.seed_resize_from_w = p.first;
    s.seed_resize_from_h = p.second;
}

void check_noise_settings(const NoiseSettings& s) {
    if (s.rng != "cpu" && s.rng != "nv") throw Error("--rng must be cpu or nv, got \"" + s.rng + "\"");
    const double f = s.subseed_strength;
    if (!std::isfinite(f) || f < 0 || f > 1)
        throw Error("--subseed-strength must be from 0 to 1, got " + number_text(f));
    if (f > 0 && !s.subseed) throw Error("--subseed-strength needs --subseed (the variation seed it blends toward)");
    if ((s.seed_resize_from_w > 0) != (s.seed_resize_from_h > 0) || s.seed_resize_from_w < 0 ||
        s.seed_resize_from_h < 0)
        throw Error("--seed-resize-from needs a width and a height, WIDTHxHEIGHT");
}

}  // namespace sd
