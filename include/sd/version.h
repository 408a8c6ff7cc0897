// The tool's version, written into every PNG's "parameters" text ("Version:")
// and printed by --version. Raise it when a change alters the images a given
// set of parameters gives, so that the text says which build made an image.
#pragma once

namespace sd {

inline constexpr const char* kVersionName = "sd-txt2img 0.18.0";

}  // namespace sd
