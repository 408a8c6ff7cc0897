#include "sd/from_png.h"

#include <cmath>
#include <map>
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

// "Key: value, Key: "quoted, value", ..." -> key -> value (quotes removed), in A1111's layout.
std::map<std::string, std::string> split_settings(const std::string& line, const std::string& where) {
    std::map<std::string, std::string> out;
    size_t i = 0;
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
        } else {
            const size_t comma = line.find(',', i);
            const size_t end = comma == std::string::npos ? line.size() : comma;
            value = line.substr(i, end - i);
            while (!value.empty() && value.back() == ' ') value.pop_back();
            i = end;
        }
        out[key] = value;
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
    if (lines.size() < 2 || lines.back().rfind("Steps: ", 0) != 0)
        throw Error(where + ": its parameters text has no settings line (\"Steps: ..., Sampler: ...\")");
    RecordedImage r;
    size_t k = 0;
    for (; k + 1 < lines.size() && lines[k].rfind("Negative prompt: ", 0) != 0; ++k)
        r.prompt += (k ? "\n" : "") + lines[k];
    for (size_t n = k; n + 1 < lines.size(); ++n) r.negative_prompt += (n == k ? lines[n].substr(17) : "\n" + lines[n]);

    // The rules --prompt and prompt files follow, before anything loads.
    check_prompt_text(r.prompt, where + ": the prompt");
    check_prompt_text(r.negative_prompt, where + ": the negative prompt");

    const auto kv = split_settings(lines.back(), where);
    for (const auto& [key, value] : kv) {
        if (key == "Steps")
            r.steps = static_cast<int>(whole(key, value, kStepsRange, where));
        else if (key == "Sampler") {
            for (const auto& s : samplers())
                if (s.a1111_name == value || s.name == value) r.sampler = s.name;
            if (!r.sampler)
                throw Error(where + ": unknown sampler \"" + text_excerpt(value) + "\" (this tool has " +
                            sampler_choices() + ")");
        } else if (key == "Schedule type") {
            r.schedule = schedule_from_a1111_name(value);
            if (r.schedule->empty()) throw Error(where + ": unknown schedule type \"" + text_excerpt(value) + "\"");
        } else if (key == "CFG scale") {
            char* end = nullptr;
            const double v = std::strtod(value.c_str(), &end);
            if (value.empty() || *end != '\0' || !std::isfinite(v))
                throw Error(where + ": \"CFG scale\" must be a number, got \"" + text_excerpt(value) + "\"");
            r.scale = check_scale(where + ": \"CFG scale\"", v);
        } else if (key == "Seed")
            r.seed = parse_seed(where + ": \"Seed\"", text_excerpt(value));
        else if (key == "Size") {
            const size_t x = value.find('x');
            if (x == std::string::npos)
                throw Error(where + ": \"Size\" must be WIDTHxHEIGHT, got \"" + text_excerpt(value) + "\"");
            r.width = static_cast<int>(whole(key, value.substr(0, x), kSideRange, where));
            r.height = static_cast<int>(whole(key, value.substr(x + 1), kSideRange, where));
        } else if (key == "Seed mode") {
            if (value != "compvis" && value != "per-image")
                throw Error(where + ": unknown seed mode \"" + text_excerpt(value) + "\"");
            r.seed_mode = value;
        } else if (key == "Prompt syntax") {
            if (value != "a1111" && value != "plain")
                throw Error(where + ": unknown prompt syntax \"" + text_excerpt(value) + "\"");
            r.prompt_syntax = value;
        } else if (key == "Image index")
            r.index = static_cast<int>(whole(key, value, {0, 1000000}, where));
        else if (key == "Batch size")
            r.batch_size = static_cast<int>(whole(key, value, kSamplesRange, where));
        else if (key == "Batch position")
            r.batch_position = static_cast<int>(whole(key, value, {0, kSamplesRange.hi}, where));
        else if (key == "Batch number")
            r.batch_number = static_cast<int>(whole(key, value, {0, 1000000}, where));
        else if (key == "Clip skip")
            r.clip_skip = static_cast<int>(whole(key, value, {1, 1000}, where));
        else if (key == "TI hashes")
            r.embeddings = hash_list(value);
        else if (key == "Lora hashes")
            r.loras = hash_list(value);
        else if (key == "Denoising strength") {
            char* end = nullptr;
            const double v = std::strtod(value.c_str(), &end);
            if (value.empty() || *end != '\0' || !std::isfinite(v) || v <= 0 || v > 1)
                throw Error(where + ": \"Denoising strength\" must be a number above 0 and at most 1, got \"" +
                            text_excerpt(value) + "\"");
            r.strength = v;
        } else if (key == "Init image hash" || key == "Mask hash") {
            if (value.size() != 64 || value.find_first_not_of("0123456789abcdef") != std::string::npos)
                throw Error(where + ": \"" + key + "\" must be a SHA-256 (64 hex digits), got \"" +
                            text_excerpt(value) + "\"");
            (key == "Mask hash" ? r.mask_hash : r.init_hash) = value;
        } else if (key == "Mask blur")
            r.mask_blur = static_cast<int>(whole(key, value, {0, 256}, where));
        else if (key == "Mask mode")
            r.invert_mask = value == "Inpaint not masked";
        else if (key == "Outpaint")
            r.outpaint = value;
        else if (key == "Resize mode")
            r.resize_mode = value;
        else if (key == "Masked content")
            r.masked_content = value;
        else if (key == "Hires upscale") {
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
        } else if (key == "Model")
            r.model = value;
        else if (key == "Version")
            r.version = value;
        // Other tools' keys (Model hash, ...) decide nothing here.
    }
    return r;
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
