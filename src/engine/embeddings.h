// Textual-inversion embeddings loaded for a run: their vectors and the ids
// their trigger words get (text/trigger_words.h).
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/script.h>

#include "text/trigger_words.h"

namespace sd {

struct Embedding {
    std::string path, trigger, hash;  // hash: A1111's short hash (embedding_file.h)
    at::Tensor vectors;               // [n, D] float32 (SDXL: clip_l's, for the first text encoder)
    at::Tensor vectors_2;             // SDXL: clip_g's [n, D2] for the second; undefined otherwise
};

// Reads every file (embedding_file.h's formats) and checks it against the
// text encoder's width; with width_2 > 0 (SDXL) every file must be A1111's SDXL
// pair, clip_l [n, width] and clip_g [n, width_2]. Throws sd::Error with one
// line naming the file: not readable, corrupt, no single tensor of vectors (no
// pair on SDXL), another width, two files with one trigger.
std::vector<Embedding> load_embeddings(const std::vector<std::string>& files, int width, int max_vectors,
                                       int width_2 = 0);

// The trigger words with ids from first_id on, in the order of `embeddings`.
std::vector<AddedWord> added_words(const std::vector<Embedding>& embeddings, int64_t first_id);

// All vectors in that order: row k is id first_id + k. [0, D] when there are none.
// second: SDXL's vectors_2 instead.
at::Tensor embedding_table(const std::vector<Embedding>& embeddings, int width, bool second = false);

// The text encoder's token embedding table [vocab, D]. Throws sd::Error.
at::Tensor token_table(const torch::jit::Module& text_encoder);

// Throws sd::Error ("re-export the model") when the text encoder was exported
// before clip skip and textual inversion (it lacks the clip_skip attribute)
// and one of them is asked for.
void check_text_encoder_features(const torch::jit::Module& text_encoder, const std::string& path, bool clip_skip,
                                 bool embeddings);

// The text encoder's output for ids [m, L] (on its device) with the last
// `skip` layers skipped; ids past its vocabulary take the rows of `extra`
// (embedding_table, on the same device) and go through forward_embeds.
at::Tensor encode_ids(torch::jit::Module& text_encoder, const at::Tensor& ids, int64_t skip, const at::Tensor& extra);

// The same for SDXL's second text encoder: (hidden states, pooled vector), through
// forward_pooled or, with added ids, forward_pooled_embeds. The pooled row is at
// argmax(ids) as diffusers (transformers' rule for bigG's config) takes it: an added
// id is the largest, so with an embedding in the text it is that token's row, not
// the end of text's. Throws sd::Error ("re-export") for an export without forward_pooled_embeds.
std::pair<at::Tensor, at::Tensor> encode_ids_pooled(torch::jit::Module& text_encoder, const at::Tensor& ids,
                                                    int64_t skip, const at::Tensor& extra);

}  // namespace sd
