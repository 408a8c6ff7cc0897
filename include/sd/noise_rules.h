// The rules for the noise options (issue 35; NoiseSettings in sd/settings.h):
// --rng, --ensd, --subseed, --subseed-strength and --seed-resize-from, the
// same whether they come from flags or from a PNG's text.
#pragma once
#include <string>

#include "sd/settings.h"

namespace sd {

// Throws sd::Error naming the flag when a value cannot be used: an unknown
// source, a strength outside [0, 1] or without a variation seed, half a seed
// resize size. Brownian tree and eta are not checked here.
void check_noise_settings(const NoiseSettings& s);

// --rng's value: "cpu" or "nv" (any case); throws sd::Error otherwise.
std::string parse_rng(const std::string& text);

// --seed-resize-from WxH into s (each side from 8 pixels, the web UI's latent
// factor); throws sd::Error naming the text otherwise.
void parse_seed_resize_from(const std::string& text, NoiseSettings& s);

}  // namespace sd
