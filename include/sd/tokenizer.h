// CLIP's byte-level BPE tokenizer (openai/CLIP simple_tokenizer.py, as used by
// Stable Diffusion 1.x; open_clip's variant for SD 2.x, chosen by the special
// token names in vocab.json), in plain C++: no LibTorch, no SentencePiece.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sd {

class ClipTokenizer {
public:
    // Reads vocab.json ({token: id}) and merges.txt (optional "#version..."
    // first line, then "a b" per line; rank = order). Throws sd::Error with a
    // one-line message naming the file if either is missing, unreadable or
    // malformed.
    static ClipTokenizer load(const std::string& vocab_json_path, const std::string& merges_txt_path);

    // BPE ids of a prompt: no BOS/EOS, no truncation. Ill-formed UTF-8 is
    // read as U+FFFD (Python's errors="replace"); it never throws on text.
    std::vector<int> encode(const std::string& utf8_text) const;

    // True for open_clip's vocabulary (SD 2.x: <start_of_text> / <end_of_text>
    // are the special texts, and html.unescape runs twice after ftfy).
    bool is_open_clip() const;

    // [bos] + encode(text)[:context_length - 2] + [eos], padded with pad to
    // context_length (what SD 1.x's text encoder sees).
    std::vector<int64_t> encode_padded(const std::string& utf8_text, int context_length = 77, int bos = 49406,
                                       int eos = 49407, int pad = 49407) const;

    ClipTokenizer(ClipTokenizer&&) noexcept;
    ClipTokenizer& operator=(ClipTokenizer&&) noexcept;
    ~ClipTokenizer();

private:
    struct Impl;
    explicit ClipTokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace sd
