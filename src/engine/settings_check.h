// The checks a batch's settings pass before anything runs: what this model
// can do with them (size, steps, sampler, SDXL-only flags, a picture to start from).
#pragma once
#include <string>

#include "sd/pipeline.h"

namespace sd {

// Throws sd::Error with one line naming the flag (and the model folder where it is the model's limit).
void check_settings(const ModelConfig& config, const std::string& model_dir, const GenerateSettings& s);

}  // namespace sd
