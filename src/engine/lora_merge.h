// Merging LoRAs into a stage's weights as it loads (src/io/lora_keys.h says
// which parameter each module changes): W' = W + m * (alpha / rank) * up @ down
// (or a LoHa's or LoKr's product; a DoRA magnitude rescales the merged weight),
// in fp32, several LoRAs stacked in order. docs/model-format.md, docs/memory.md.
#pragma once
#include <string>
#include <vector>

#include <torch/script.h>

#include "io/lora_keys.h"

namespace sd {

// One LoRA file and its multipliers (A1111's text-encoder and UNet weights).
struct LoraMerge {
    LoraFile file;
    double text_weight = 1, unet_weight = 1;
};

// Replaces every parameter of m that the LoRAs change for `stage` ("unet",
// "text_encoder" or SDXL's "text_encoder_2"; the text encoders take text_weight)
// by a new tensor holding the merged weight, merged in fp32 and converted at once to
// `held`, the type the stage will hold (the same values the stage's own conversion
// would give later, without every merged weight waiting in fp32); the old data
// (mapped from the weight file) is let go, so its pages are released. The other
// parameters are left as they are. Throws sd::Error when a LoRA file cannot be read.
void merge_loras(torch::jit::Module& m, const std::string& stage, const std::vector<LoraMerge>& loras,
                 at::ScalarType held = at::kFloat);

// The fp32 change one module of `file` makes to its target of this shape, before the
// multiplier: scale() times the product its kind says (lora_keys.h: LoRA's
// up.flatten(1) @ down.flatten(1), LoHa's, LoKr's), reshaped to `shape`. Its
// tensors come from the file read_lora opened; NaN or infinite values are refused,
// naming the file and the tensor.
at::Tensor lora_delta(const LoraFile& file, const LoraModule& module, at::IntArrayRef shape);

// Merges one module into w (fp32, the target's shape) at multiplier `weight`:
// W + m * lora_delta, or with a DoRA magnitude W + m * (decompose(W + lora_delta) - W)
// (lora_keys.h). Stacked modules each see the weight the ones before them left.
void apply_lora(at::Tensor& w, const LoraFile& file, const LoraModule& module, double weight);

}  // namespace sd
