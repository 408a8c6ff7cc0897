#include "engine/sdxl_conditioning.h"

#include <cmath>

#include "sd/error.h"
#include "sd/model_config.h"
#include "sd/tokenizer.h"

namespace sd {

at::Tensor size_embedding(const SizeValues& sizes, int dim) {
    const int64_t half = dim / 2;
    // The reference's op order: (-ln(max_period) * arange) / half, exp, then v * freqs.
    auto freqs = at::exp(at::arange(half, at::kFloat) * (-std::log(10000.0)) / static_cast<double>(half));
    auto v = at::tensor(std::vector<float>(sizes.begin(), sizes.end()), at::kFloat).view({-1, 1});
    auto args = v * freqs.view({1, -1});
    return at::cat({at::cos(args), at::sin(args)}, -1).reshape({-1});
}

namespace {

struct Encoded {
    at::Tensor hidden;  // [k * L, D1 + D2]
    at::Tensor pooled;  // [P]
};

// Every window of these prompts through both encoders, one batch each.
std::vector<Encoded> encode_both(const SdxlEncoders& enc, const std::vector<PromptChunks>& first,
                                 const std::vector<PromptChunks>& second, int64_t L) {
    auto rows_of = [&](const std::vector<PromptChunks>& prompts) {
        std::vector<int64_t> ids;
        for (const auto& p : prompts)
            for (const auto& row : p.ids) ids.insert(ids.end(), row.begin(), row.end());
        const int64_t rows = static_cast<int64_t>(ids.size()) / L;
        return at::from_blob(ids.data(), {rows, L}, at::kLong).clone();
    };
    const at::Tensor z1 = enc.first(rows_of(first));
    const auto [z2, pooled] = enc.second(rows_of(second));
    std::vector<Encoded> out;
    int64_t r = 0;
    for (size_t i = 0; i < first.size(); ++i) {
        const PromptChunks& p = first[i];
        std::vector<at::Tensor> chunks;
        const int64_t first_row = r;
        for (const auto& w : p.weights) {
            at::Tensor a = z1[r], b = z2[r];
            if (p.weighted()) {
                a = apply_weights(a, w);
                b = apply_weights(b, w);
            }
            chunks.push_back(at::cat({a, b}, -1));
            ++r;
        }
        out.push_back({at::cat(chunks), pooled[first_row]});
    }
    return out;
}

}  // namespace

SdxlConditioning encode_sdxl_conditioning(const SdxlEncoders& prompt_encoders, const SdxlEncoders& negative_encoders,
                                          const ClipTokenizer& tok, const ModelConfig& c,
                                          const std::vector<std::string>& prompts,
                                          const std::vector<std::string>& negatives, const PromptSyntax& syntax,
                                          const SizeValues& sizes, const std::vector<AddedWord>& added) {
    const int64_t L = c.context_length;
    auto tokenize = [&](const std::vector<std::string>& texts, int pad) {
        std::vector<PromptChunks> v;
        for (const auto& t : texts)
            v.push_back(tokenize_prompt(tok, t, syntax, c.context_length, c.bos_id, c.eos_id, pad, added));
        return v;
    };
    const int pad2 = c.sdxl.text_encoder_2_pad_id;
    auto encode = [&](const SdxlEncoders& enc, const std::vector<std::string>& texts) {
        return encode_both(enc, tokenize(texts, c.pad_id), tokenize(texts, pad2), L);
    };
    std::vector<Encoded> cond = encode(prompt_encoders, prompts);
    // Only the non-empty negatives run; the empty ones are zeros, sized below.
    std::vector<std::string> spoken;
    for (const auto& n : negatives)
        if (!n.empty()) spoken.push_back(n);
    std::vector<Encoded> said = spoken.empty() ? std::vector<Encoded>{} : encode(negative_encoders, spoken);

    int64_t longest = 0;
    for (const auto* side : {&cond, &said})
        for (const auto& e : *side) longest = std::max(longest, e.hidden.size(0));
    const int64_t width = cond[0].hidden.size(1), pooled_dim = cond[0].pooled.size(0);
    std::vector<Encoded> uncond;
    size_t next_said = 0;
    for (const auto& n : negatives)
        uncond.push_back(n.empty() ? Encoded{at::zeros({longest, width}), at::zeros({pooled_dim})} : said[next_said++]);

    for (auto [side, enc] : {std::pair{&cond, &prompt_encoders}, std::pair{&uncond, &negative_encoders}}) {
        at::Tensor empty;  // this side's encoding of "" (one window), for padding
        for (auto& e : *side) {
            if (e.hidden.size(0) == longest) continue;
            if (!empty.defined()) empty = encode(*enc, {""})[0].hidden;
            std::vector<at::Tensor> parts = {e.hidden};
            for (int64_t k = e.hidden.size(0); k < longest; k += L) parts.push_back(empty);
            e.hidden = at::cat(parts);
        }
    }
    const at::Tensor size_part = size_embedding(sizes, c.sdxl.size_embedding_dim);
    auto stack = [&](const std::vector<Encoded>& side, SdxlConditioning& out, bool is_cond) {
        std::vector<at::Tensor> hidden, y;
        for (const auto& e : side) {
            hidden.push_back(e.hidden);
            y.push_back(at::cat({e.pooled, size_part}));
        }
        (is_cond ? out.cond : out.uncond) = at::stack(hidden);
        (is_cond ? out.cond_y : out.uncond_y) = at::stack(y);
    };
    SdxlConditioning out;
    stack(cond, out, true);
    if (!uncond.empty()) stack(uncond, out, false);
    if (out.cond_y.size(1) != c.sdxl.adm_in_channels)
        throw Error("the SDXL vector has " + std::to_string(out.cond_y.size(1)) + " values but the UNet takes " +
                    std::to_string(c.sdxl.adm_in_channels) + " (model.json sdxl.adm_in_channels): re-export the model");
    return out;
}

}  // namespace sd
