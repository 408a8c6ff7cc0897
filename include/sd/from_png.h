// Remaking an image from its PNG: the "parameters" text it carries (written by
// parameters_text in src/run/batch_plan.cpp, AUTOMATIC1111's layout) read back.
// Three writers are read: this tool, AUTOMATIC1111's web UI (and the forks that
// copy its text: Forge, SD.Next) and stable-diffusion.cpp, whose dialect differs
// (its sampler spelling, "RNG: cuda", "Eta: inf", "Guidance", a trailing "SDCPP: {...}").
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sd {

// What --from-png reads of a file: at most this many bytes.
constexpr size_t kMaxRecordedPngBytes = 64u << 20;
// A compvis image is remade by replaying its whole batch; a recorded batch
// larger than this is refused rather than spending minutes and gigabytes on one image.
constexpr int kMaxReplayBatch = 64;

// Who wrote a parameters text: its "Version" and its own keys say.
enum class TextWriter {
    this_tool,  // "Seed mode" or "Version: sd-txt2img ..."
    web_ui,     // AUTOMATIC1111's layout from any other program (absent "RNG" means its GPU default, nv)
    sdcpp,      // stable-diffusion.cpp: "Version: stable-diffusion.cpp" or an "SDCPP" key
};

// One entry of a "Lora hashes" or "TI hashes" value: "name: hash".
struct RecordedHash {
    std::string name, hash;
};

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
    // SDXL's size conditioning ("Original size", "Target size" WxH, "Crop coords"
    // TOP,LEFT), written only where it is not the image's own: (width, height), (top, left).
    std::optional<std::pair<int, int>> original_size, crop_coords, target_size;
    std::vector<RecordedHash> embeddings;  // "TI hashes": trigger word and A1111's short hash
    std::vector<RecordedHash> loras;       // "Lora hashes": tag name and A1111's short hash
    std::string model, version;
    // Made from a picture (img2img, inpainting): "Denoising strength" and the
    // files' SHA-256 ("Init image hash", "Mask hash"), "Mask blur", "Mask mode",
    // "Outpaint", "Resize mode", "Masked content".
    std::optional<double> strength;
    std::string init_hash, mask_hash;
    std::optional<int> mask_blur;
    bool invert_mask = false;
    std::optional<std::string> outpaint, resize_mode, masked_content;
    // Noise (issue 35), always set from the text or its writer's default ("RNG"
    // absent: cpu for this tool's texts, nv for the web UI's GPU default).
    // "Variation seed": every image of a run blends toward the same one.
    std::string rng = "cpu";
    int64_t ensd = 0;
    std::optional<uint64_t> subseed;
    double subseed_strength = 0;
    int seed_resize_from_w = 0, seed_resize_from_h = 0;
    std::string brownian_tree = "a1111";
    std::optional<double> eta;  // "Eta" / "Eta DDIM"; unset: the sampler's default
    TextWriter writer = TextWriter::web_ui;
    // Fields the tool cannot honour, "Key: value" as the text has them (values
    // shortened), in the text's order: an unknown key, a sampler or schedule the
    // tool lacks, "RNG: std_default", hires fix... --from-png refuses such a PNG
    // (check_honoured) unless --from-png-lenient skips them, leaving those settings at the tool's own.
    std::vector<std::string> unhonoured;
    // The hires fix (its strength is "Denoising strength"): "Hires upscale",
    // "Hires resize" (WxH), "Hires steps", "Hires upscaler" (our name).
    std::optional<double> hires_scale;
    std::optional<int> hires_width, hires_height, hires_steps;
    std::optional<std::string> hires_upscaler;
    bool hires() const { return hires_scale || hires_width; }
};

// Text from a file as a message shows it: at most 60 bytes, control characters
// as '?', so that a crafted value can neither flood the terminal nor break the one line.
std::string text_excerpt(const std::string& text);

// Parses a "parameters" text; `where` names its source in errors. Throws
// sd::Error for a text without the settings line or with a malformed value,
// and for a prompt or negative prompt that breaks a prompt rule (check_prompt_text).
RecordedImage parse_parameters_text(const std::string& text, const std::string& where);

// Nothing when every field of the text is honoured. Otherwise, without
// `lenient`, throws sd::Error: one line naming the file and each field the tool
// cannot honour (at most 8, then how many more), and that --from-png-lenient
// skips them; with it, returns that line's list for a warning.
std::string check_honoured(const RecordedImage& r, const std::string& path, bool lenient);

// The "parameters" text of a PNG file, parsed. Throws sd::Error (one line
// naming the file) when it is not a regular file, is larger than
// kMaxRecordedPngBytes, is not a PNG, or carries no such text.
RecordedImage read_recorded_image(const std::string& png_path);

// The lower-case hex SHA-256 of a file the user hands in (`what` names its
// flag in messages): what "Init image hash" and "Mask hash" record.
std::string file_sha256(const std::string& path, const std::string& what);

}  // namespace sd
