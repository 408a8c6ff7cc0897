// Text from a file, made safe to print in a one-line message: a name read
// from a tensor file may hold a NUL (which would cut the message off), a line
// break (a second line) or bytes that are not UTF-8 (raw bytes on a terminal).
#pragma once
#include <string>
#include <string_view>

namespace sd {

// The text with control characters, DEL and bytes that are not well-formed
// UTF-8 written as \xNN (a backslash as \\), cut to max_bytes with "..." after.
std::string printable(std::string_view text, size_t max_bytes = 200);

// A number as messages and prompt tags write it: printf's %g (six significant digits,
// no trailing zeros: 0.8, 1e+20).
std::string number_text(double v);

}  // namespace sd
