#include "sd/prompts.h"

#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/img2img_schedule.h"
#include "io/fs_util.h"
#include "io/json_depth.h"
#include "sd/error.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A JSON whole number within r, or the same error a flag gets, naming the key.
int64_t get_whole(const nlohmann::json& v, const std::string& what, WholeRange r) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(r.hi)))
        throw Error(what + " must be a whole number from " + std::to_string(r.lo) + " to " + std::to_string(r.hi) +
                    ", got " + v.dump());
    return check_whole(what, v.get<int64_t>(), r);
}

PromptOverrides parse_overrides(const nlohmann::json& j, const std::string& where) {
    PromptOverrides o;
    for (const auto& [key, v] : j.items()) {
        const std::string what = where + ": \"" + key + "\"";
        if (key == "prompt") continue;
        if (key == "negative_prompt") {
            if (!v.is_string()) throw Error(what + " must be a string, got " + v.dump());
            check_prompt_text(v.get<std::string>(), what);
            o.negative_prompt = v.get<std::string>();
        } else if (key == "seed" || key == "subseed") {
            // The whole unsigned 64-bit range, as --seed.
            if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
                throw Error(what + " must be a whole number from 0 to 18446744073709551615, got " + v.dump());
            (key == "seed" ? o.seed : o.subseed) = v.get<uint64_t>();
        } else if (key == "rng" || key == "seed_resize_from") {
            if (!v.is_string()) throw Error(what + " must be a string, got " + v.dump());
            (key == "rng" ? o.rng : o.seed_resize_from) = v.get<std::string>();
        } else if (key == "ensd") {
            constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
            if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > kMax))
                throw Error(what + " must be a whole number, got " + v.dump());
            o.ensd = v.get<int64_t>();
        } else if (key == "subseed_strength") {
            if (!v.is_number()) throw Error(what + " must be a number, got " + v.dump());
            o.subseed_strength = v.get<double>();
        } else if (key == "steps") {
            o.steps = static_cast<int>(get_whole(v, what, kStepsRange));
        } else if (key == "scale") {
            if (!v.is_number()) throw Error(what + " must be a number, got " + v.dump());
            o.scale = check_scale(what, v.get<double>());
        } else if (key == "H") {
            o.height = static_cast<int>(get_whole(v, what, kSideRange));
        } else if (key == "W") {
            o.width = static_cast<int>(get_whole(v, what, kSideRange));
        } else if (key == "sampler") {
            if (!v.is_string() || v.get<std::string>().empty())
                throw Error(what + " must be a sampler name, got " + v.dump());
            o.sampler = v.get<std::string>();
        } else if (key == "schedule") {
            if (!v.is_string() || v.get<std::string>().empty())
                throw Error(what + " must be a schedule name, got " + v.dump());
            o.schedule = v.get<std::string>();
        } else if (key == "n_iter") {
            o.n_iter = static_cast<int>(get_whole(v, what, kIterRange));
        } else if (key == "init_img" || key == "mask" || key == "outpaint") {
            if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().find('\0') != std::string::npos)
                throw Error(what + " must be a non-empty string, got " + v.dump());
            (key == "init_img" ? o.init_img : key == "mask" ? o.mask : o.outpaint) = v.get<std::string>();
        } else if (key == "strength") {
            if (!v.is_number()) throw Error(what + " must be a number, got " + v.dump());
            o.strength = check_strength(what, v.get<double>());
        } else if (key == "hires_scale") {
            if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 64)
                throw Error(what + " must be a number above 0 and at most 64, got " + v.dump());
            o.hires_scale = v.get<double>();
        } else if (key == "hires_strength") {
            if (!v.is_number()) throw Error(what + " must be a number, got " + v.dump());
            o.hires_strength = check_strength(what, v.get<double>());
        } else if (key == "hires_steps") {
            o.hires_steps = static_cast<int>(get_whole(v, what, {0, kStepsRange.hi}));
        } else if (key == "hires_upscaler") {
            if (!v.is_string() || (v != "latent" && v != "latent-nearest" && v != "lanczos"))
                throw Error(what + " must be latent, latent-nearest or lanczos, got " + v.dump());
            o.hires_upscaler = v.get<std::string>();
        } else {
            throw Error(where + ": unknown key \"" + key +
                        "\" (known: prompt, negative_prompt, seed, steps, scale, H, W, sampler, schedule, n_iter, "
                        "init_img, mask, strength, outpaint, rng, ensd, subseed, subseed_strength, seed_resize_from, "
                        "hires_scale, hires_steps, hires_strength, hires_upscaler)");
        }
    }
    return o;
}

// One line of at most kMaxLineBytes into `line` (without its '\n'); false at
// the end of input. Reads through the stream buffer a character at a time, so
// a pipe's lines are taken as they arrive and an endless line stops at the limit.
bool read_line(std::istream& in, std::string& line, const std::string& where) {
    line.clear();
    std::streambuf* buf = in.rdbuf();
    for (;;) {
        const int c = buf->sbumpc();
        if (c == std::char_traits<char>::eof()) return !line.empty();
        if (c == '\n') return true;
        if (line.size() >= kMaxLineBytes)
            throw Error(where + ": line longer than " + std::to_string(kMaxLineBytes / 1024) +
                        " KiB (not a prompt file?)");
        line.push_back(static_cast<char>(c));
    }
}

}  // namespace

std::string PromptLine::where() const {
    return source.empty() ? std::string("--prompt") : source + ":" + std::to_string(line);
}

void check_prompt_text(const std::string& text, const std::string& what) {
    if (!is_valid_utf8(text)) throw Error(what + " is not valid UTF-8 text");
    if (text.find('\0') != std::string::npos) throw Error(what + " contains a NUL character");
    if (text.size() > kMaxPromptBytes)
        throw Error(what + " is " + std::to_string(text.size()) + " bytes long; the limit is " +
                    std::to_string(kMaxPromptBytes) + " bytes, far more than any prompt needs");
}

PromptReader::PromptReader(std::istream& in, std::string name, bool jsonl)
    : in_(&in), name_(std::move(name)), jsonl_(jsonl) {}

PromptReader::PromptReader(const std::string& path)
    : name_(path == "-" ? "<stdin>" : path), jsonl_(ends_with(path, ".jsonl")) {
    if (path == "-") {
        in_ = &std::cin;
        return;
    }
    check_regular_file(path, "prompt file");  // a FIFO would block here: pipes come in through --from-file -
    file_ = std::make_unique<std::ifstream>(path, std::ios::binary);
    if (!*file_) throw Error("cannot read prompt file " + path);
    in_ = file_.get();
}

PromptReader::~PromptReader() = default;

std::optional<PromptLine> PromptReader::next() {
    std::string line;
    while (read_line(*in_, line, name_ + ":" + std::to_string(number_ + 1))) {
        ++number_;
        if (number_ == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // byte order mark
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const std::string where = name_ + ":" + std::to_string(number_);
        if (!is_valid_utf8(line)) throw Error(where + ": not valid UTF-8 text");
        const auto first = line.find_first_not_of(" \t");
        if (first == std::string::npos) continue;
        if (!jsonl_ && line[first] == '#') continue;
        if (++prompts_ > kMaxPrompts)
            throw Error(name_ + " holds more than " + std::to_string(kMaxPrompts) +
                        " prompts; split it into several files");
        PromptLine p;
        p.line = number_;
        p.source = name_;
        if (jsonl_) {
            nlohmann::json j;
            try {
                j = parse_json_limited(line, where + ": not valid JSON (nested more than " +
                                                 std::to_string(kMaxJsonDepth) + " levels deep)");
            } catch (const nlohmann::json::exception&) {
                throw Error(where + ": not valid JSON");
            }
            if (!j.is_object()) throw Error(where + ": expected a JSON object with \"prompt\"");
            auto it = j.find("prompt");
            if (it == j.end() || !it->is_string()) throw Error(where + ": missing string \"prompt\"");
            p.prompt = it->get<std::string>();
            p.overrides = parse_overrides(j, where);
        } else {
            p.prompt = line;
        }
        check_prompt_text(p.prompt, where + ": the prompt");
        return p;
    }
    if (in_->bad()) throw Error("cannot read prompt file " + name_);
    return std::nullopt;
}

namespace {

std::vector<PromptLine> read_all(PromptReader& reader, const std::string& name) {
    std::vector<PromptLine> out;
    while (auto p = reader.next()) out.push_back(std::move(*p));
    if (out.empty()) throw Error("prompt file " + name + " holds no prompts");
    return out;
}

}  // namespace

std::vector<PromptLine> parse_prompts(const std::string& text, const std::string& name, bool jsonl) {
    std::istringstream in(text);
    PromptReader reader(in, name, jsonl);
    return read_all(reader, name);
}

std::vector<PromptLine> read_prompt_file(const std::string& path) {
    PromptReader reader(path);
    return read_all(reader, path == "-" ? "<stdin>" : path);
}

}  // namespace sd
