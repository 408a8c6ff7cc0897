#include "sd/from_png.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/fs_util.h"
#include "io/png_text.h"
#include "io/sha256.h"
#include "run/batch_plan.h"
#include "sd/error.h"
#include "sd/prompts.h"
#include "sd/sampler_catalog.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

// The end of a JSON object value starting at line[i] == '{' (stable-diffusion.cpp's
// "SDCPP: {...}", Civitai's "Hashes: {...}"), strings and nesting skipped; npos if it never closes.
size_t json_object_end(const std::string& line, size_t i) {
    int depth = 0;
    for (bool in_string = false; i < line.size(); ++i) {
        const char c = line[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{') {
            ++depth;
        } else if (c == '}' && --depth == 0) {
            return i + 1;
        }
    }
    return std::string::npos;
}

// "Key: value, Key: "quoted, value", Key: {json}, ..." -> (key, value) in the text's order, quotes removed.
Fields split_settings(const std::string& line, const std::string& where) {
    Fields out;
    size_t i = 0;
    bool objects = true;  // {...} values are looked for
    while (i < line.size()) {
        while (i < line.size() && (line[i] == ' ' || line[i] == ',')) ++i;
        if (i >= line.size()) break;
        const size_t colon = line.find(':', i);
        if (colon == std::string::npos)
            throw Error(where + ": setting without ':' in \"" + text_excerpt(line.substr(i)) + "\"");
        const std::string key = line.substr(i, colon - i);
        i = colon + 1;
        while (i < line.size() && line[i] == ' ') ++i;
        std::string value;
        if (i < line.size() && line[i] == '"') {
            // A JSON string: find its closing quote, skipping escaped characters.
            size_t j = i + 1;
            while (j < line.size() && line[j] != '"') j += line[j] == '\\' ? 2 : 1;
            if (j >= line.size()) throw Error(where + ": unterminated quoted value of \"" + text_excerpt(key) + "\"");
            try {
                value = nlohmann::json::parse(line.substr(i, j + 1 - i)).get<std::string>();
            } catch (const nlohmann::json::exception&) {
                throw Error(where + ": malformed quoted value of \"" + text_excerpt(key) + "\"");
            }
            i = j + 1;
        } else if (const size_t close =
                       i < line.size() && line[i] == '{' && objects ? json_object_end(line, i) : std::string::npos;
                   close != std::string::npos) {
            value = line.substr(i, close - i);
            i = close;
        } else {
            // A '{' that never closes is a plain value, and so is every later one: the
            // scan went to the end of the line once, and will not again (crafted text).
            if (i < line.size() && line[i] == '{') objects = false;
            const size_t comma = line.find(',', i);
            const size_t end = comma == std::string::npos ? line.size() : comma;
            value = line.substr(i, end - i);
            while (!value.empty() && value.back() == ' ') value.pop_back();
            i = end;
        }
        out.emplace_back(key, value);
    }
    return out;
}

int64_t whole(const std::string& key, const std::string& value, WholeRange r, const std::string& where) {
    size_t used = 0;
    long long v = 0;
    try {
        v = std::stoll(value, &used);
    } catch (const std::logic_error&) {
        used = 0;
    }
    if (used == 0 || used != value.size())
        throw Error(where + ": \"" + key + "\" must be a whole number, got \"" + text_excerpt(value) + "\"");
    return check_whole(where + ": \"" + key + "\"", v, r);
}

// A bound or value in a message: %g, "0.6", "1000".
std::string format_limit(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// A finite number within [lo, hi].
double number(const std::string& key, const std::string& value, double lo, double hi, const std::string& where) {
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
        throw Error(where + ": \"" + key + "\" must be a number from " + format_limit(lo) + " to " + format_limit(hi) +
                    ", got \"" + text_excerpt(value) + "\"");
    return v;
}

// "WIDTHxHEIGHT"
std::pair<int, int> size_pair(const std::string& key, const std::string& value, const std::string& where) {
    const size_t x = value.find('x');
    if (x == std::string::npos)
        throw Error(where + ": \"" + key + "\" must be WIDTHxHEIGHT, got \"" + text_excerpt(value) + "\"");
    return {static_cast<int>(whole(key, value.substr(0, x), kSideRange, where)),
            static_cast<int>(whole(key, value.substr(x + 1), kSideRange, where))};
}

// The entries of a "TI hashes" or "Lora hashes" value, "name: hash, name: hash".
std::vector<RecordedHash> hash_list(const std::string& value) {
    std::vector<RecordedHash> out;
    for (size_t start = 0; start < value.size();) {
        size_t end = value.find(", ", start);
        if (end == std::string::npos) end = value.size();
        const std::string entry = value.substr(start, end - start);
        const size_t colon = entry.rfind(':');
        if (colon != std::string::npos && colon > 0) {
            RecordedHash h{entry.substr(0, colon), entry.substr(colon + 1)};
            while (!h.hash.empty() && h.hash.front() == ' ') h.hash.erase(0, 1);
            out.push_back(std::move(h));
        }
        start = end + 2;
    }
    return out;
}

bool same_letters(const std::string& a, const std::string& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

// The catalog's sampler of a name: the web UI's ("DPM++ 2M") or this tool's ("dpmpp_2m"), in any case.
std::optional<std::string> sampler_named(const std::string& name) {
    for (const auto& s : samplers())
        if (same_letters(s.a1111_name, name) || same_letters(s.name, name)) return s.name;
    return std::nullopt;
}

// A "Schedule type" value as a schedule of the catalog: the web UI's label
// ("Karras", "SGM Uniform"; schedule_from_a1111_name) or, as v1.6-1.8 wrote it,
// its own lower-case name ("karras", "exponential"); "" if neither.
std::string schedule_named(const std::string& value) {
    if (std::string s = schedule_from_a1111_name(value); !s.empty()) return s;
    for (const auto& s : samplers())
        for (const auto& name : s.schedules)
            if (value == name) return name;
    return "";
}

// "Automatic" (and "Uniform"): the sampler's own choice, which an old combined name already made.
bool sampler_own_schedule(const std::string& schedule) {
    return schedule == schedule_from_a1111_name("Automatic") || schedule == schedule_from_a1111_name("Uniform");
}

// The web UI's "Sampler": its name, or before v1.9 the name and the schedule in
// one ("DPM++ 2M Karras", "DPM++ 2M SDE Exponential"); v1.9 reads those the same way.
bool read_web_ui_sampler(const std::string& value, RecordedImage& r) {
    if (const auto s = sampler_named(value)) {
        r.sampler = s;
        return true;
    }
    for (size_t cut = value.rfind(' '); cut != std::string::npos && cut > 0; cut = value.rfind(' ', cut - 1)) {
        const std::string schedule = schedule_named(value.substr(cut + 1));
        const auto s = sampler_named(value.substr(0, cut));
        if (s && !schedule.empty() && !sampler_own_schedule(schedule)) {
            r.sampler = s;
            if (!r.schedule) r.schedule = schedule;  // an explicit "Schedule type" wins
            return true;
        }
    }
    return false;
}

// stable-diffusion.cpp's --sampling-method values with the web UI sampler of the same
// algorithm (its src/stable-diffusion.cpp at 97d29908). Its others have none: dpm2
// keeps the next-to-last sigma the web UI's DPM2 drops, lcm samples sigmas rather
// than LCMScheduler's timesteps, its SDE samplers draw their own noise, and the rest
// (ipndm, tcd, res_*, *_cfg_pp, ...) the web UI lacks.
const std::pair<const char*, const char*> kSdcppSamplers[] = {
    {"euler", "Euler"}, {"euler_a", "Euler a"}, {"heun", "Heun"}, {"dpm++2s_a", "DPM++ 2S a"}, {"dpm++2m", "DPM++ 2M"}};
// Its --scheduler values with the web UI's "Schedule type" ("discrete" is the model's own sigmas).
const std::pair<const char*, const char*> kSdcppSchedules[] = {
    {"discrete", "Uniform"},        {"karras", "Karras"}, {"exponential", "Exponential"}, {"ays", "Align Your Steps"},
    {"sgm_uniform", "SGM Uniform"}, {"simple", "Simple"}, {"kl_optimal", "KL Optimal"}};

// stable-diffusion.cpp's "Sampler: <method> <scheduler>" ("euler_a karras"), each
// part read that it has a match; false unless both have (the catalog checks the schedule later).
bool read_sdcpp_sampler(const std::string& value, RecordedImage& r) {
    const size_t cut = value.rfind(' ');
    const std::string method = value.substr(0, cut), scheduler = cut == std::string::npos ? "" : value.substr(cut + 1);
    for (const auto& [theirs, web_ui] : kSdcppSamplers)
        if (method == theirs) r.sampler = sampler_named(web_ui);
    for (const auto& [theirs, label] : kSdcppSchedules)
        if (const std::string schedule = schedule_named(label); scheduler == theirs && !schedule.empty())
            r.schedule = schedule;
    return r.sampler && r.schedule;
}

// The settings in stable-diffusion.cpp's "SDCPP" JSON that its text line does not
// show and that would change the picture, named as "SDCPP sampling/flow_shift" when set.
void check_sdcpp_json(const std::string& value, RecordedImage& r) {
    const auto j = nlohmann::json::parse(value, nullptr, false);
    if (!j.is_object() || !j.value("mode", nlohmann::json()).is_string()) {
        r.unhonoured.push_back("SDCPP: " + text_excerpt(value) + " (not its JSON object)");
        return;
    }
    auto unset = [&](const char* path) {
        const auto p = j.value(nlohmann::json::json_pointer(path), nlohmann::json());
        return p.is_null() || (p.is_number() && p.get<double>() == 0) ||
               (p.is_string() && p.get<std::string>().empty()) || (p.is_array() && p.empty()) ||
               (p.is_boolean() && !p.get<bool>());
    };
    if (j.value("mode", "") != "img_gen") r.unhonoured.push_back("SDCPP mode: " + text_excerpt(j.value("mode", "?")));
    for (const char* path : {"/sampling/custom_sigmas", "/sampling/flow_shift", "/sampling/shifted_timestep",
                             "/sampling/extra_sample_args", "/sampling/guidance/img_cfg",
                             "/sampling/guidance/slg/scale", "/sampler_rng", "/hires", "/adetailer", "/video"})
        if (!unset(path)) r.unhonoured.push_back(std::string("SDCPP ") + (path + 1));
}

// Keys that describe rather than decide the picture (or that --from-png checks
// elsewhere): accepted and left alone. "Batch size"/"Batch pos" of the web UI
// do not change an image: its noise comes from the image's own seed.
bool descriptive_key(const std::string& key, TextWriter writer) {
    static const char* const any[] = {"Model", "Model hash", "VAE",      "VAE hash",         "Version",
                                      "User",  "Hashes",     "Template", "Negative Template"};
    for (const char* k : any)
        if (key == k) return true;
    if (writer == TextWriter::web_ui) return key == "Batch size" || key == "Batch pos";
    return writer == TextWriter::sdcpp && key == "Guidance";  // distilled guidance: Flux-type models only
}

// A web UI setting that is honoured when it holds its default value.
bool default_valued(const std::string& key, const std::string& value) {
    static const std::pair<const char*, const char*> defaults[] = {{"Beta schedule alpha", "0.6"},
                                                                   {"Beta schedule beta", "0.6"},
                                                                   {"Emphasis", "Original"},
                                                                   {"Conditional mask weight", "1.0"},
                                                                   {"Conditional mask weight", "1"}};
    for (const auto& [k, v] : defaults)
        if (key == k && value == v) return true;
    return false;
}

TextWriter writer_of(const Fields& fields) {
    for (const auto& [key, value] : fields) {
        if (key == "Seed mode" || (key == "Version" && value.rfind("sd-txt2img", 0) == 0)) return TextWriter::this_tool;
        if (key == "SDCPP" || (key == "Version" && value == "stable-diffusion.cpp")) return TextWriter::sdcpp;
    }
    return TextWriter::web_ui;
}

}  // namespace

std::string text_excerpt(const std::string& text) {
    std::string out;
    for (char c : text.substr(0, 64)) out += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
    if (text.size() <= 60) return out;
    size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xc0) == 0x80) --cut;  // not inside a UTF-8 character
    return out.substr(0, cut) + "...";
}

RecordedImage parse_parameters_text(const std::string& text, const std::string& where) {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
        lines.push_back(text.substr(start, nl - start));
    lines.push_back(text.substr(start));
    // (one line: the web UI's text of an empty prompt)
    if (lines.back().rfind("Steps: ", 0) != 0)
        throw Error(where + ": its parameters text has no settings line (\"Steps: ..., Sampler: ...\")");
    RecordedImage r;
    size_t k = 0;
    for (; k + 1 < lines.size() && lines[k].rfind("Negative prompt: ", 0) != 0; ++k)
        r.prompt += (k ? "\n" : "") + lines[k];
    for (size_t n = k; n + 1 < lines.size(); ++n) r.negative_prompt += (n == k ? lines[n].substr(17) : "\n" + lines[n]);

    // The rules --prompt and prompt files follow, before anything loads.
    check_prompt_text(r.prompt, where + ": the prompt");
    check_prompt_text(r.negative_prompt, where + ": the negative prompt");

    const Fields fields = split_settings(lines.back(), where);
    r.writer = writer_of(fields);
    // Absent "RNG": the web UI's and stable-diffusion.cpp's default is the GPU's numbers (nv);
    // this tool writes "RNG: CPU" for its cpu default, and wrote no "RNG" before it had nv.
    r.rng = r.writer == TextWriter::this_tool ? "cpu" : "nv";
    std::string sampler_field, schedule_field;  // as the text has them, for messages
    bool eta_ddim = false;
    bool hires = false;
    for (const auto& [key, value] : fields)
        if (key.rfind("Hires ", 0) == 0 || key == "First pass size") hires = true;
    auto cannot = [&](const std::string& key, const std::string& value) {
        r.unhonoured.push_back(text_excerpt(key) + ": " + text_excerpt(value));
    };
    for (const auto& [key, value] : fields) {
        if (key == "Steps")
            r.steps = static_cast<int>(whole(key, value, kStepsRange, where));
        else if (key == "Sampler") {
            sampler_field = value;
            const bool known =
                r.writer == TextWriter::sdcpp ? read_sdcpp_sampler(value, r) : read_web_ui_sampler(value, r);
            if (!known) cannot(key, value);
        } else if (key == "Schedule type") {
            schedule_field = value;
            const std::string schedule = schedule_named(value);
            if (schedule.empty())
                cannot(key, value);
            else if (!sampler_own_schedule(schedule) || !r.schedule)  // "Automatic" leaves "DPM++ 2M Karras" alone
                r.schedule = schedule;
        } else if (key == "CFG scale") {
            char* end = nullptr;
            const double v = std::strtod(value.c_str(), &end);
            if (value.empty() || *end != '\0' || !std::isfinite(v))
                throw Error(where + ": \"CFG scale\" must be a number, got \"" + text_excerpt(value) + "\"");
            r.scale = check_scale(where + ": \"CFG scale\"", v);
        } else if (key == "Seed")
            r.seed = parse_seed(where + ": \"Seed\"", text_excerpt(value));
        else if (key == "Size") {
            const auto [w, h] = size_pair(key, value, where);
            r.width = w;
            r.height = h;
        } else if (key == "RNG") {
            // The web UI's sources (GPU and its CPU imitation NV give the same numbers),
            // stable-diffusion.cpp's cuda (the same) and cpu (torch's CPU generator, as ComfyUI).
            if (same_letters(value, "CPU"))
                r.rng = "cpu";
            else if (same_letters(value, "GPU") || same_letters(value, "NV") || value == "cuda")
                r.rng = "nv";
            else {
                cannot(key, value);  // stable-diffusion.cpp's std_default: no other tool has it
                r.rng = "cpu";       // skipped: the tool's own default
            }
        } else if (key == "ENSD")
            r.ensd = whole(key, value, {INT64_MIN, INT64_MAX}, where);
        else if (key == "Variation seed")
            r.subseed = parse_seed(where + ": \"Variation seed\"", text_excerpt(value));
        else if (key == "Variation seed strength")
            r.subseed_strength = number(key, value, 0, 1, where);
        else if (key == "Seed resize from") {
            const auto [w, h] = size_pair(key, value, where);
            r.seed_resize_from_w = w;
            r.seed_resize_from_h = h;
        } else if (key == "Eta" || key == "Eta DDIM") {
            // stable-diffusion.cpp writes "inf" for "the sampler's default".
            if (!(r.writer == TextWriter::sdcpp && value == "inf")) r.eta = number(key, value, 0, 1000, where);
            eta_ddim = key == "Eta DDIM";
        } else if (key == "Brownian tree" && r.writer == TextWriter::this_tool) {
            if (value != "a1111" && value != "kdiffusion")
                throw Error(where + ": unknown Brownian tree \"" + text_excerpt(value) + "\"");
            r.brownian_tree = value;
        } else if (key == "Seed mode" && r.writer == TextWriter::this_tool) {
            if (value != "compvis" && value != "per-image")
                throw Error(where + ": unknown seed mode \"" + text_excerpt(value) + "\"");
            r.seed_mode = value;
        } else if (key == "Prompt syntax" && r.writer == TextWriter::this_tool) {
            if (value != "a1111" && value != "plain")
                throw Error(where + ": unknown prompt syntax \"" + text_excerpt(value) + "\"");
            r.prompt_syntax = value;
        } else if (key == "Image index" && r.writer == TextWriter::this_tool)
            r.index = static_cast<int>(whole(key, value, {0, 1000000}, where));
        else if (key == "Batch size" && r.writer == TextWriter::this_tool)
            r.batch_size = static_cast<int>(whole(key, value, kSamplesRange, where));
        else if (key == "Batch position" && r.writer == TextWriter::this_tool)
            r.batch_position = static_cast<int>(whole(key, value, {0, kSamplesRange.hi}, where));
        else if (key == "Batch number" && r.writer == TextWriter::this_tool)
            r.batch_number = static_cast<int>(whole(key, value, {0, 1000000}, where));
        else if (key == "Clip skip")
            r.clip_skip = static_cast<int>(whole(key, value, {1, 1000}, where));
        else if (key == "Original size" || key == "Target size" || key == "Crop coords") {
            const bool crop = key == "Crop coords";
            const size_t sep = value.find(crop ? ',' : 'x');
            if (sep == std::string::npos)
                throw Error(where + ": \"" + key + "\" must be " + (crop ? "TOP,LEFT" : "WIDTHxHEIGHT") + ", got \"" +
                            text_excerpt(value) + "\"");
            const WholeRange range = crop ? WholeRange{0, kSideRange.hi} : kSideRange;
            const std::pair<int, int> v = {static_cast<int>(whole(key, value.substr(0, sep), range, where)),
                                           static_cast<int>(whole(key, value.substr(sep + 1), range, where))};
            (crop ? r.crop_coords : key == "Target size" ? r.target_size : r.original_size) = v;
        } else if (key == "TI hashes")
            r.embeddings = hash_list(value);
        else if (key == "Lora hashes")
            r.loras = hash_list(value);
        else if (key == "Denoising strength") {
            // With hires fix it is the second pass's, not a picture's to start from:
            // this tool's own hires text is remade, the web UI's is not (its second
            // pass lengthens the schedule and crops to the size; docs/img2img.md).
            // The web UI's txt2img writes "Denoising strength: 0" for none.
            if (hires && r.writer != TextWriter::this_tool)
                cannot(key, value);
            else if (const double v = number(key, value, 0, 1, where); v > 0)
                r.strength = v;
        } else if (key == "Init image hash" || key == "Mask hash") {
            const bool sha256 = value.size() == 64 && value.find_first_not_of("0123456789abcdef") == std::string::npos;
            if (sha256)
                (key == "Mask hash" ? r.mask_hash : r.init_hash) = value;
            else if (r.writer == TextWriter::this_tool)
                throw Error(where + ": \"" + key + "\" must be a SHA-256 (64 hex digits), got \"" +
                            text_excerpt(value) + "\"");
            // the web UI's own hash of the picture cannot be compared: left alone
        } else if (key == "Mask blur")
            r.mask_blur = static_cast<int>(whole(key, value, {0, 256}, where));
        else if (key == "Mask mode")
            r.invert_mask = value == "Inpaint not masked";
        else if (key == "Outpaint" && r.writer == TextWriter::this_tool)
            r.outpaint = value;
        else if (key == "Resize mode" && r.writer == TextWriter::this_tool)
            r.resize_mode = value;
        else if (key == "Masked content") {
            r.masked_content = value;  // the web UI writes "latent noise" for this tool's latent-noise
            std::replace(r.masked_content->begin(), r.masked_content->end(), ' ', '-');
        } else if (key.rfind("Hires ", 0) == 0 && r.writer != TextWriter::this_tool) {
            cannot(key, value);
        } else if (key == "Hires upscale") {
            char* end = nullptr;
            const double v = std::strtod(value.c_str(), &end);
            if (value.empty() || *end != '\0' || !std::isfinite(v) || v <= 0 || v > 64)
                throw Error(where + ": \"Hires upscale\" must be a number above 0, got \"" + text_excerpt(value) +
                            "\"");
            r.hires_scale = v;
        } else if (key == "Hires resize") {
            const WholePair v = parse_whole_pair(where + ": \"Hires resize\"", value, 'x', 1);
            r.hires_width = v.first;
            r.hires_height = v.second;
        } else if (key == "Hires steps")
            r.hires_steps = static_cast<int>(whole(key, value, {0, kStepsRange.hi}, where));
        else if (key == "Hires upscaler") {
            r.hires_upscaler = hires_upscaler_from_a1111(value);
            if (r.hires_upscaler->empty())
                throw Error(where + ": \"Hires upscaler\" " + text_excerpt(value) +
                            " is not one of this tool's (Latent, Latent (nearest), Lanczos)");
        } else if (key == "Model") {
            r.model = value;
        } else if (key == "Version")
            r.version = value;
        else if (key == "SDCPP" && r.writer == TextWriter::sdcpp)
            check_sdcpp_json(value, r);
        else if (!descriptive_key(key, r.writer) && !default_valued(key, value))
            cannot(key, value);  // hires fix, face restoration, an extension's settings, ...
    }
    if (r.subseed_strength != 0 && !r.subseed) cannot("Variation seed strength", format_limit(r.subseed_strength));
    // A schedule belongs to the sampler it came with: without that sampler, the tool's own runs without it.
    if (!sampler_field.empty() && !r.sampler) r.schedule.reset();
    // The web UI writes "Eta DDIM" for its DDIM-type samplers and "Eta" for k-diffusion's.
    if (r.eta && r.sampler && eta_ddim != (sampler_info(*r.sampler).family == SamplerFamily::compvis)) r.eta.reset();
    // The sampler and schedule together, as the catalog has them (a schedule the sampler does not take).
    if (r.sampler && r.schedule) {
        try {
            check_sampler_settings(*r.sampler, *r.schedule);
        } catch (const Error&) {
            cannot(schedule_field.empty() ? "Sampler" : "Schedule type",
                   schedule_field.empty() ? sampler_field : schedule_field);
            r.schedule.reset();
        }
    }
    return r;
}

std::string check_honoured(const RecordedImage& r, const std::string& path, bool lenient) {
    if (r.unhonoured.empty()) return "";
    std::string list;
    for (size_t i = 0; i < r.unhonoured.size() && i < 8; ++i) list += (i ? ", " : "") + r.unhonoured[i];
    if (r.unhonoured.size() > 8) list += " and " + std::to_string(r.unhonoured.size() - 8) + " more";
    if (lenient) return list;
    // A sampler the tool lacks (not just its schedule): name the ones it has.
    const bool sampler = !r.sampler && std::any_of(r.unhonoured.begin(), r.unhonoured.end(),
                                                   [](const std::string& f) { return f.rfind("Sampler: ", 0) == 0; });
    throw Error(path + ": this tool cannot honour " + list +
                (sampler ? " (its samplers: " + sampler_choices() + ")" : "") +
                "; --from-png-lenient remakes it without them");
}

RecordedImage read_recorded_image(const std::string& png_path) {
    const std::string bytes = read_file_capped(png_path, kMaxRecordedPngBytes, "--from-png");
    std::map<std::string, std::string> texts;
    try {
        texts = png_read_text(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const Error& e) {
        throw Error("--from-png " + png_path + " is not a readable PNG: " + e.what());
    }
    const auto it = texts.find("parameters");
    if (it == texts.end()) throw Error("--from-png: " + png_path + " carries no \"parameters\" text");
    return parse_parameters_text(it->second, png_path);
}

std::string file_sha256(const std::string& path, const std::string& what) {
    check_regular_file(path, what);
    return sha256_file_hex(path);
}

}  // namespace sd
