// Textual-inversion embeddings loaded for a run: their vectors and the ids
// their trigger words get (text/trigger_words.h).
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>

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

}  // namespace sd
