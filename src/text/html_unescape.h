// Python's html.unescape (all of HTML5's named references, numeric references
// with Python's replacements), which open_clip's tokenizer (SD 2.x) applies
// twice after ftfy; HF's CLIPTokenizer (SD 1.x) does not.
#pragma once
#include <string>

namespace sd {

std::u32string html_unescape(const std::u32string& text);

}  // namespace sd
