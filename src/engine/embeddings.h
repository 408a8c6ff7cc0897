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
    at::Tensor vectors;               // [n, D] float32
};

// Reads every file (embedding_file.h's formats) and checks it against the
// text encoder's width. Throws sd::Error with one line naming the file: not
// readable, corrupt, no single tensor of vectors, another width, two files
// with one trigger.
std::vector<Embedding> load_embeddings(const std::vector<std::string>& files, int width, int max_vectors);

// The trigger words with ids from first_id on, in the order of `embeddings`.
std::vector<AddedWord> added_words(const std::vector<Embedding>& embeddings, int64_t first_id);

// All vectors in that order: row k is id first_id + k. [0, D] when there are none.
at::Tensor embedding_table(const std::vector<Embedding>& embeddings, int width);

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

}  // namespace sd
