// Remaking an image from its PNG: the "parameters" text it carries (written by
// parameters_text in src/run/batch_plan.cpp, AUTOMATIC1111's layout) read back.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sd {

// What a PNG's "parameters" text records. Keys the text lacks stay unset.
struct RecordedImage {
    std::string prompt, negative_prompt;
    std::optional<int> steps, width, height;
    std::optional<std::string> sampler;   // our name (the text holds AUTOMATIC1111's)
    std::optional<std::string> schedule;  // default | karras
    std::optional<double> scale;
    std::optional<uint64_t> seed;
    std::optional<std::string> seed_mode;      // compvis | per-image
    std::optional<std::string> prompt_syntax;  // plain when recorded; a1111 otherwise
    std::optional<int> index, batch_size, batch_position, batch_number;
    std::optional<int> clip_skip;  // "Clip skip" (A1111's numbering)
    std::vector<std::string> embeddings;  // trigger words of "TI hashes" ("name: hash, ...")
    std::string model, version;
};

// Parses a "parameters" text; `where` names its source in errors. Throws
// sd::Error for a text without the settings line or with a malformed value.
RecordedImage parse_parameters_text(const std::string& text, const std::string& where);

// The "parameters" text of a PNG file, parsed. Throws sd::Error when the file
// is not a PNG or carries no such text.
RecordedImage read_recorded_image(const std::string& png_path);

}  // namespace sd
