// Prompt syntax of AUTOMATIC1111's web UI, and prompts longer than one
// 77-token window. No LibTorch here: this part is tokenizer work.
//
// Weighting ("emphasis"): (text) multiplies the weight of text by 1.1,
// [text] divides it by 1.1, (text:1.3) multiplies it by 1.3; brackets nest
// and multiply; \( \) \[ \] \\ are literal characters; an unclosed bracket
// runs to the end of the prompt; a closing bracket without an opening one is
// plain text. BREAK (upper case, a word by itself) ends the current chunk.
//
// Long prompts: the tokens are cut into chunks of 75; each chunk is encoded as
// [BOS] + chunk + [EOS] + padding (one 77-token window) and the text
// encoder's outputs are concatenated along the sequence (the A1111 / ComfyUI
// convention).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "text/trigger_words.h"

namespace sd {

class ClipTokenizer;

struct WeightedText {
    std::string text;
    double weight = 1.0;
    bool is_break = false;  // a BREAK keyword (text empty)
};

// The prompt as runs of text with their weights; adjacent runs of equal weight
// are merged. Never throws: any text parses (an empty prompt gives one empty run).
std::vector<WeightedText> parse_prompt_weights(const std::string& prompt);

// Throws Error("<what>: ...") when a weight of the prompt is not a finite float
// (thousands of nested brackets, or a number like 1e400): such a weight would
// only show up after sampling, as NaN latents blamed on the model.
void check_prompt_weights(const std::string& prompt, const std::string& what);

// A1111's composable prompts ("composable diffusion"): a (positive) prompt split at
// AND, a word of its own (its \bAND\b), each part with the weight a trailing
// ":NUMBER" gives it (1 without one; the number and the space before the colon
// leave the text). A prompt without AND is one part, with its weight too: "a
// cat:0.5" is "a cat" at half the guidance. The guided output is
// e_u + scale * sum(weight * (e_part - e_u)) (engine/guidance.h).
struct ComposedPart {
    std::string text;
    double weight = 1.0;
};
std::vector<ComposedPart> composed_parts(const std::string& prompt);

struct PromptSyntax {
    bool long_prompts = true;  // more than 75 tokens: more chunks (else: truncated to one)
    bool weighting = true;     // A1111 weights and BREAK (else: the prompt is plain text)
};

// A prompt as 77-token windows: ids [chunks][context_length] and each id's weight.
struct PromptChunks {
    std::vector<std::vector<int64_t>> ids;
    std::vector<std::vector<float>> weights;
    bool weighted() const;  // some weight differs from 1
};

// Tokenizes a prompt into chunks. With neither option, and for any prompt of
// at most 75 tokens without weighting syntax, this is exactly one window equal
// to ClipTokenizer::encode_padded (the reference's ids).
// Trigger words of `added` (textual inversion) become their count positions
// with their weight; with long prompts an embedding is never cut between two
// windows (it starts the next one, as A1111 does), without them the window is
// cut at 77 tokens afterwards, as diffusers does.
PromptChunks tokenize_prompt(const ClipTokenizer& tok, const std::string& prompt, const PromptSyntax& syntax,
                             int context_length, int bos, int eos, int pad, const std::vector<AddedWord>& added = {});

}  // namespace sd
