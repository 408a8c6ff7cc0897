// Prompt sources: a plain text file (one prompt a line) or JSON lines.
#pragma once
#include <string>
#include <vector>

namespace sd {

struct PromptLine {
    std::string prompt;
    int line = 0;  // 1-based line number in the source
};

// Plain text: one prompt a line; blank lines and lines starting with '#' are
// skipped; CRLF accepted. A ".jsonl" file: one JSON object a line with a
// string "prompt". "-" reads standard input. Throws sd::Error naming the file
// (and line) when it is unreadable, malformed or holds no prompt.
std::vector<PromptLine> read_prompt_file(const std::string& path);

// Same parsing from text already read; `name` is used in error messages.
std::vector<PromptLine> parse_prompts(const std::string& text, const std::string& name, bool jsonl);

}  // namespace sd
