// Prompt helpers shared by the prompt-weighting unit tests and the
// conditioning tests: the project's CLIP tokenizer and runs of known words.
#pragma once
#include <string>

#include "sd/tokenizer.h"
#include "test_util.h"

namespace sdtest {

// The CLIP tokenizer of models/clip, loaded once.
inline const sd::ClipTokenizer& clip() {
    static auto tok = sd::ClipTokenizer::load(env("SD_SOURCE_DIR") + "/models/clip/vocab.json",
                                              env("SD_SOURCE_DIR") + "/models/clip/merges.txt");
    return tok;
}

// n words of one token each, starting at word `offset` of a fixed list.
inline std::string words(int n, int offset = 0) {
    static const char* w[] = {"red", "blue", "green", "cat", "dog", "tree", "house", "river", "sky", "sun"};
    std::string s;
    for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + w[(i + offset) % 10];
    return s;
}

}  // namespace sdtest
