// Prompt clean-up of the CLIP tokenizer: a C++ port of what the reference does
// before BPE (ftfy 6.3.1 `fix_text` with its default settings, CLIP's
// `whitespace_clean`, Python's `str.lower`). Works on code points (UTF-32).
#pragma once
#include <string>

namespace sd {

// UTF-8 -> code points. Ill-formed bytes become U+FFFD, one per maximal
// ill-formed subpart, like Python's bytes.decode("utf-8", errors="replace").
std::u32string utf8_to_u32(const std::string& utf8);
std::string u32_to_utf8(const std::u32string& text);

// ftfy.fix_text(text) with ftfy 6.3.1 defaults: HTML entities (only when the
// line has no '<'), mojibake, C1 controls, Latin ligatures, full/half width,
// curly quotes, line breaks, terminal escapes, control characters, NFC.
// Named HTML entities are limited to the HTML 4 set plus &apos; (and their
// all-caps forms); ftfy knows all of HTML5's.
std::u32string fix_text(const std::u32string& text);

// CLIP's whitespace_clean: every run of whitespace -> one space, then strip.
std::u32string whitespace_clean(const std::u32string& text);

// Python str.lower(): full Unicode lower-casing, final sigma included.
std::u32string to_lower(const std::u32string& text);

// What the tokenizer splits: to_lower(whitespace_clean(fix_text(text))).
// (HF CLIPTokenizer semantics: no extra html.unescape as openai's basic_clean.)
std::u32string clean_prompt(const std::string& utf8);

// Python str.isspace() (the set that `\s` matches in Python's re).
bool is_py_space(char32_t c);

namespace detail {
// Exposed for tests: ftfy's mojibake heuristic (badness.is_bad) and its
// encoding fixer (ftfy.fix_encoding).
bool is_bad(const std::u32string& text);
std::u32string fix_encoding(const std::u32string& text);
}  // namespace detail

}  // namespace sd
