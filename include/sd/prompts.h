// Prompt sources: --prompt, a plain text file (one prompt a line) or JSON
// lines with per-line settings.
#pragma once
#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sd {

// A prompt longer than this is refused: 16 KiB is thousands of tokens, dozens
// of 75-token chunks, so a longer one is almost certainly a wrong file or a
// paste mistake.
constexpr size_t kMaxPromptBytes = 16 * 1024;

// Prompt files are read a line at a time and no line may be longer than this
// (a JSONL line holds a prompt and a negative prompt, escaped), so that reading
// /dev/zero or a binary file stops at once instead of filling memory.
constexpr size_t kMaxLineBytes = 256 * 1024;

// At most this many prompts in one file.
constexpr size_t kMaxPrompts = 1000000;

// Settings a JSONL line may give for itself; unset ones come from the flags.
struct PromptOverrides {
    std::optional<std::string> negative_prompt;
    std::optional<uint64_t> seed;
    std::optional<int> steps;
    std::optional<double> scale;
    std::optional<int> height, width;  // "H", "W"
    std::optional<std::string> sampler;
    std::optional<std::string> schedule;
    std::optional<int> n_iter;
    // Starting from a picture (issue 33): "init_img", "mask", "strength", "outpaint".
    std::optional<std::string> init_img, mask, outpaint;
    std::optional<double> strength;
    // The web UI's noise (issue 35): "rng", "ensd", "subseed", "subseed_strength", "seed_resize_from" (WxH).
    std::optional<std::string> rng, seed_resize_from;
    std::optional<int64_t> ensd;
    std::optional<uint64_t> subseed;
    std::optional<double> subseed_strength;
    bool sets_noise() const { return rng || seed_resize_from || ensd || subseed || subseed_strength; }
    // The hires fix: "hires_scale", "hires_steps", "hires_strength", "hires_upscaler".
    std::optional<double> hires_scale, hires_strength;
    std::optional<int> hires_steps;
    std::optional<std::string> hires_upscaler;
};

struct PromptLine {
    std::string prompt;
    int line = 0;        // 1-based line number in the source; 0 for --prompt
    std::string source;  // file name for messages ("<stdin>" for -), empty for --prompt
    PromptOverrides overrides;

    // "FILE:LINE" for messages, or "--prompt".
    std::string where() const;
};

// Plain text: one prompt a line; blank lines and lines starting with '#' are
// skipped; CRLF and a UTF-8 byte order mark accepted. A ".jsonl" file: one JSON
// object a line with a string "prompt" and optional "negative_prompt", "seed",
// "steps", "scale", "H", "W", "sampler", "schedule", "n_iter", and a picture to
// start from: "init_img", "mask", "strength", "outpaint" (paths as given, from the
// working folder, like the flags), and the hires fix's "hires_scale",
// "hires_steps", "hires_strength", "hires_upscaler". "-" reads standard input.
// Throws sd::Error naming the file (and line) when it is unreadable, malformed,
// not UTF-8, has an unknown key or bad value, or holds no prompt.
std::vector<PromptLine> read_prompt_file(const std::string& path);

// A prompt source read one line at a time: a file, standard input ("-"), or
// any stream. next() returns the next prompt as soon as its line has arrived,
// and nothing at the end. Throws sd::Error naming the file and line (the same
// errors as read_prompt_file, except that an empty source is not one).
class PromptReader {
public:
    explicit PromptReader(const std::string& path);
    PromptReader(std::istream& in, std::string name, bool jsonl);
    ~PromptReader();
    std::optional<PromptLine> next();

private:
    std::unique_ptr<std::ifstream> file_;
    std::istream* in_ = nullptr;
    std::string name_;
    bool jsonl_ = false;
    int number_ = 0;      // lines read
    size_t prompts_ = 0;  // prompts returned
};

// Same parsing from text already read; `name` is used in error messages.
std::vector<PromptLine> parse_prompts(const std::string& text, const std::string& name, bool jsonl);

// Throws sd::Error "<what>: ..." when text is not valid UTF-8, contains NUL or
// is longer than kMaxPromptBytes.
void check_prompt_text(const std::string& text, const std::string& what);

}  // namespace sd
