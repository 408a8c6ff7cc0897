// The UNet's text conditioning for a batch: prompts (and negative prompts)
// tokenized into 77-token chunks (prompt_weights.h), encoded chunk by chunk,
// weighted, and concatenated along the sequence.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "text/prompt_weights.h"

namespace sd {

class ClipTokenizer;
struct ModelConfig;

// The text encoder: ids [m, L] (int64) -> hidden states [m, L, D].
using TextEncodeFn = std::function<at::Tensor(const at::Tensor& ids)>;

struct Conditioning {
    at::Tensor cond, uncond;  // [n, k * L, D], the same k for both
};

// Scales each token's embedding by its weight, then rescales the chunk so that
// its mean is what it was (AUTOMATIC1111's emphasis). z [L, D], weights [L].
at::Tensor apply_weights(const at::Tensor& z, const std::vector<float>& weights);

// Encodes prompts (one per conditional row: an image's, or each part of an
// A1111 composed one) and negatives (one per image, or none at all: then only
// the prompts are encoded and uncond is left undefined). Every context gets the
// largest chunk count k of the batch: shorter ones are padded with the
// encoding of the empty prompt, chunk by chunk (as AUTOMATIC1111 pads the
// shorter of prompt and negative prompt). For prompts of at most 75 tokens
// without weighting syntax this is exactly the single-window reference.
Conditioning encode_conditioning(const TextEncodeFn& encode, const ClipTokenizer& tok, const ModelConfig& config,
                                 const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 const PromptSyntax& syntax);

// The same with one encoder for the prompts and another for the negatives
// (clip skip applies to the prompts only, as in diffusers), and the trigger
// words of textual-inversion embeddings (prompt_weights.h, AddedWord): their
// positions get ids past the vocabulary, which the encoders must map to the
// embeddings' vectors. Each side pads with its own encoder's empty prompt.
Conditioning encode_conditioning(const TextEncodeFn& encode_prompt, const TextEncodeFn& encode_negative,
                                 const ClipTokenizer& tok, const ModelConfig& config,
                                 const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 const PromptSyntax& syntax, const std::vector<AddedWord>& added);

}  // namespace sd
