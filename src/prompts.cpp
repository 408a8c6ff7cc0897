#include "prompts.h"

#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.h"
#include "fs_util.h"

namespace sd {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A whole number in [lo, hi], or an error naming the key and what was given.
int64_t get_int(const nlohmann::json& v, const std::string& key, int64_t lo, int64_t hi, const std::string& where) {
    if (v.is_number_integer()) {
        const bool fits = !v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(hi);
        if (fits && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi) return v.get<int64_t>();
    }
    throw Error(where + ": \"" + key + "\" must be a whole number from " + std::to_string(lo) + " to " +
                std::to_string(hi) + ", got " + v.dump());
}

PromptOverrides parse_overrides(const nlohmann::json& j, const std::string& where) {
    PromptOverrides o;
    constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
    for (const auto& [key, v] : j.items()) {
        if (key == "prompt") continue;
        if (key == "negative_prompt") {
            if (!v.is_string()) throw Error(where + ": \"negative_prompt\" must be a string, got " + v.dump());
            check_prompt_text(v.get<std::string>(), where + ": \"negative_prompt\"");
            o.negative_prompt = v.get<std::string>();
        } else if (key == "seed") {
            o.seed = static_cast<uint64_t>(get_int(v, key, 0, std::numeric_limits<int64_t>::max(), where));
        } else if (key == "steps") {
            o.steps = static_cast<int>(get_int(v, key, 1, 10000, where));
        } else if (key == "scale") {
            if (!v.is_number() || !std::isfinite(v.get<double>()))
                throw Error(where + ": \"scale\" must be a number, got " + v.dump());
            o.scale = v.get<double>();
        } else if (key == "H") {
            o.height = static_cast<int>(get_int(v, key, 1, 65536, where));
        } else if (key == "W") {
            o.width = static_cast<int>(get_int(v, key, 1, 65536, where));
        } else if (key == "sampler") {
            if (!v.is_string() || v.get<std::string>().empty())
                throw Error(where + ": \"sampler\" must be a sampler name, got " + v.dump());
            o.sampler = v.get<std::string>();
        } else if (key == "n_iter") {
            o.n_iter = static_cast<int>(get_int(v, key, 1, kMaxInt, where));
        } else {
            throw Error(where + ": unknown key \"" + key +
                        "\" (known: prompt, negative_prompt, seed, steps, scale, H, W, sampler, n_iter)");
        }
    }
    return o;
}

}  // namespace

std::string PromptLine::where() const {
    return source.empty() ? std::string("--prompt") : source + ":" + std::to_string(line);
}

bool is_valid_utf8(const std::string& s) {
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        int len;
        uint32_t cp;
        if (c < 0x80) { ++i; continue; }
        if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
        else return false;
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

void check_prompt_text(const std::string& text, const std::string& what) {
    if (!is_valid_utf8(text)) throw Error(what + " is not valid UTF-8 text");
    if (text.find('\0') != std::string::npos) throw Error(what + " contains a NUL character");
    if (text.size() > kMaxPromptBytes)
        throw Error(what + " is " + std::to_string(text.size()) + " bytes long; the limit is " +
                    std::to_string(kMaxPromptBytes) + " (the model reads only the first 75 tokens)");
}

std::vector<PromptLine> parse_prompts(const std::string& text, const std::string& name, bool jsonl) {
    std::vector<PromptLine> out;
    std::istringstream in(text);
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
        ++number;
        if (number == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // byte order mark
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const std::string where = name + ":" + std::to_string(number);
        if (!is_valid_utf8(line)) throw Error(where + ": not valid UTF-8 text");
        const auto first = line.find_first_not_of(" \t");
        if (first == std::string::npos) continue;
        if (!jsonl && line[first] == '#') continue;
        PromptLine p;
        p.line = number;
        p.source = name;
        if (jsonl) {
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const nlohmann::json::exception&) {
                throw Error(where + ": not valid JSON");
            }
            if (!j.is_object()) throw Error(where + ": expected a JSON object with \"prompt\"");
            auto it = j.find("prompt");
            if (it == j.end() || !it->is_string()) throw Error(where + ": missing string \"prompt\"");
            p.prompt = it->get<std::string>();
            p.overrides = parse_overrides(j, where);
            check_prompt_text(p.prompt, where + ": the prompt");
        } else {
            p.prompt = line;
            check_prompt_text(p.prompt, where + ": the prompt");
        }
        out.push_back(std::move(p));
    }
    if (out.empty()) throw Error("prompt file " + name + " holds no prompts");
    return out;
}

std::vector<PromptLine> read_prompt_file(const std::string& path) {
    std::stringstream ss;
    if (path == "-") {
        ss << std::cin.rdbuf();
    } else {
        std::ifstream in(path, std::ios::binary);
        if (!in || is_directory(path)) throw Error("cannot read prompt file " + path);
        ss << in.rdbuf();
        if (in.bad()) throw Error("cannot read prompt file " + path);
    }
    return parse_prompts(ss.str(), path == "-" ? "<stdin>" : path, ends_with(path, ".jsonl"));
}

}  // namespace sd
