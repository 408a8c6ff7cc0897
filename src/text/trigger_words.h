// Trigger words of textual-inversion embeddings in prompt text. No LibTorch.
//
// A trigger stands for an embedding's n vectors: n consecutive token positions
// in place of the word (as diffusers' load_textual_inversion and A1111 do).
// It is found as a whole word, in exact case (as A1111 matches its tokens):
// "embone" in "a photo of embone, beach" or "(embone:1.2)", not in "embones"
// (a letter, digit or '_' next to a word character of the trigger keeps it
// from matching) nor in "EmbOne".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

// One embedding as the tokenizer sees it: its positions get the ids
// first_id .. first_id + count - 1, ids past the vocabulary, which the text
// encoder's caller maps to the embedding's vectors.
struct AddedWord {
    std::string trigger;
    int64_t first_id = 0;
    int count = 1;
};

// A stretch of prompt text, or one trigger word (`word` indexes the list).
struct TextPiece {
    std::string text;
    int word = -1;  // -1: plain text
};

// The text cut at every trigger of `words` (the longest one where several
// start at the same place). Without triggers in it: one piece, the text itself.
std::vector<TextPiece> split_trigger_words(const std::string& text, const std::vector<AddedWord>& words);

// Indexes of the words whose trigger occurs in the text, each once, in list order.
std::vector<int> trigger_words_used(const std::string& text, const std::vector<AddedWord>& words);

}  // namespace sd
