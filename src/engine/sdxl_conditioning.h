// SDXL's conditioning, as sgm's GeneralConditioner builds it
// (tests/fixtures/sdxl-tiny/README.md): the UNet's context is the first text
// encoder's (CLIP ViT-L) hidden states followed by the second's (OpenCLIP
// bigG), and its vector y the second's pooled output followed by six size
// embeddings: original height and width, crop top and left, target height
// and width.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "engine/conditioning.h"

namespace sd {

// The second encoder: ids [m, L] -> (hidden states [m, L, D2], pooled [m, P]).
using PooledEncodeFn = std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& ids)>;

struct SdxlEncoders {
    TextEncodeFn first;
    PooledEncodeFn second;
};

struct SdxlConditioning {
    at::Tensor cond, uncond;      // [n, k * L, D1 + D2]; uncond undefined without negatives
    at::Tensor cond_y, uncond_y;  // [n, P + 6 * size_dim]
};

// Original (h, w), crop (top, left), target (h, w), in this order.
using SizeValues = std::array<int, 6>;

// sgm's ConcatTimestepEmbedderND over the six values: for each, `dim`
// sinusoids, cosines first, of v * exp(-ln(10000) k / (dim / 2)), in float32
// as the reference computes them. [6 * dim].
at::Tensor size_embedding(const SizeValues& sizes, int dim);

// Prompts (one per conditional row) and negatives (one per image, or none: then uncond is
// undefined) through both encoders. Each prompt is tokenized once per encoder
// (the first pads with config.pad_id, the second with its own pad id), in the
// same 75-token windows with the same A1111 weights, which each encoder's
// output gets separately (as AUTOMATIC1111 weights each SDXL embedder); the
// pooled output is the first window's. An empty negative prompt gives zeros
// for its hidden states and pooled output (sgm's force_uc_zero_embeddings,
// diffusers' force_zeros_for_empty_prompt, A1111 alike); its size part is
// the prompt's. Shorter contexts are padded with their side's encoding of "".
// `added`: textual-inversion trigger words, whose positions get the same ids
// past the vocabulary in both tokenizations (each encoder maps them to its own
// vectors), in prompts and negatives alike.
SdxlConditioning encode_sdxl_conditioning(const SdxlEncoders& prompt_encoders, const SdxlEncoders& negative_encoders,
                                          const ClipTokenizer& tok, const ModelConfig& config,
                                          const std::vector<std::string>& prompts,
                                          const std::vector<std::string>& negatives, const PromptSyntax& syntax,
                                          const SizeValues& sizes, const std::vector<AddedWord>& added = {});

}  // namespace sd
