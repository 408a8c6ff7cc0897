// Prompt sources: --prompt, a plain text file (one prompt a line) or JSON
// lines with per-line settings.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sd {

// A prompt longer than this is refused: the model reads only its first 75
// tokens, so a longer one is almost certainly a wrong file or a paste mistake.
constexpr size_t kMaxPromptBytes = 16 * 1024;

// Settings a JSONL line may give for itself; unset ones come from the flags.
struct PromptOverrides {
    std::optional<std::string> negative_prompt;
    std::optional<uint64_t> seed;
    std::optional<int> steps;
    std::optional<double> scale;
    std::optional<int> height, width;  // "H", "W"
    std::optional<std::string> sampler;
    std::optional<int> n_iter;
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
// "steps", "scale", "H", "W", "sampler", "n_iter". "-" reads standard input.
// Throws sd::Error naming the file (and line) when it is unreadable, malformed,
// not UTF-8, has an unknown key or bad value, or holds no prompt.
std::vector<PromptLine> read_prompt_file(const std::string& path);

// Same parsing from text already read; `name` is used in error messages.
std::vector<PromptLine> parse_prompts(const std::string& text, const std::string& name, bool jsonl);

// Throws sd::Error "<what>: ..." when text is not valid UTF-8, contains NUL or
// is longer than kMaxPromptBytes.
void check_prompt_text(const std::string& text, const std::string& what);

bool is_valid_utf8(const std::string& s);

}  // namespace sd
