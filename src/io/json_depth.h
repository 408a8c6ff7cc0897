// JSON read from files a user may have been given (model.json, JSON lines).
// nlohmann's parser keeps its own stack, but printing a value (the "got ..."
// of an error message) and walking one are recursive: a value nested 100000
// deep overflowed the stack (found while fuzzing; docs/reliability.md). Such
// text is refused while it is parsed, before anything recurses.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace sd {

// Far more than any file of ours needs (model.json: 4 levels, a JSONL line: 1).
constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse(text), except that an array or object nested more than
// kMaxJsonDepth levels deep throws sd::Error(too_deep). Syntax errors throw
// nlohmann's parse_error, as parse does.
nlohmann::json parse_json_limited(const std::string& text, const std::string& too_deep);

}  // namespace sd
