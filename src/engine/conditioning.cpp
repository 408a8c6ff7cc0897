#include "engine/conditioning.h"

#include "sd/model_config.h"
#include "sd/tokenizer.h"

namespace sd {

at::Tensor apply_weights(const at::Tensor& z, const std::vector<float>& weights) {
    auto w = at::tensor(weights, at::kFloat).view({-1, 1});
    auto original_mean = z.mean();
    auto weighted = z * w.expand(z.sizes());
    return weighted * (original_mean / weighted.mean());
}

namespace {

// All chunks of these prompts through the encoder in one batch, weighted:
// one tensor [chunks_i * L, D] per prompt.
std::vector<at::Tensor> encode_all(const TextEncodeFn& encode, const std::vector<PromptChunks>& prompts, int64_t L) {
    std::vector<int64_t> ids;
    for (const auto& p : prompts)
        for (const auto& row : p.ids) ids.insert(ids.end(), row.begin(), row.end());
    const int64_t rows = static_cast<int64_t>(ids.size()) / L;
    at::Tensor z = encode(at::from_blob(ids.data(), {rows, L}, at::kLong).clone());
    std::vector<at::Tensor> out;
    int64_t r = 0;
    for (const auto& p : prompts) {
        std::vector<at::Tensor> chunks;
        for (const auto& w : p.weights) {
            at::Tensor zc = z[r++];
            chunks.push_back(p.weighted() ? apply_weights(zc, w) : zc);
        }
        out.push_back(at::cat(chunks));
    }
    return out;
}

}  // namespace

Conditioning encode_conditioning(const TextEncodeFn& encode, const ClipTokenizer& tok, const ModelConfig& c,
                                 const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 const PromptSyntax& syntax) {
    return encode_conditioning(encode, encode, tok, c, prompts, negatives, syntax, {});
}

Conditioning encode_conditioning(const TextEncodeFn& encode_prompt, const TextEncodeFn& encode_negative,
                                 const ClipTokenizer& tok, const ModelConfig& c,
                                 const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 const PromptSyntax& syntax, const std::vector<AddedWord>& added) {
    const int64_t L = c.context_length;
    auto tokenize = [&](const std::vector<std::string>& texts) {
        std::vector<PromptChunks> v;
        for (const auto& t : texts)
            v.push_back(tokenize_prompt(tok, t, syntax, c.context_length, c.bos_id, c.eos_id, c.pad_id, added));
        return v;
    };
    // Prompts and negatives in separate encoder calls, as the reference encodes cond and uncond.
    auto cond = encode_all(encode_prompt, tokenize(prompts), L);
    auto uncond = negatives.empty() ? std::vector<at::Tensor>{} : encode_all(encode_negative, tokenize(negatives), L);

    int64_t longest = 0;
    for (const auto* side : {&cond, &uncond})
        for (const auto& z : *side) longest = std::max(longest, z.size(0));
    for (auto [side, encode] : {std::pair{&cond, &encode_prompt}, std::pair{&uncond, &encode_negative}}) {
        at::Tensor empty;  // this side's encoding of the empty prompt's window, for padding
        for (auto& z : *side) {
            if (z.size(0) == longest) continue;
            if (!empty.defined()) empty = encode_all(*encode, tokenize({""}), L)[0];
            std::vector<at::Tensor> parts = {z};
            for (int64_t k = z.size(0); k < longest; k += L) parts.push_back(empty);
            z = at::cat(parts);
        }
    }
    return {at::stack(cond), uncond.empty() ? at::Tensor() : at::stack(uncond)};
}

}  // namespace sd
