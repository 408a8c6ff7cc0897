// SD 1.x and 2.x: one CLIP text encoder, long prompts and A1111 weights
// (conditioning.h), clip skip for the prompts only (as diffusers), and
// textual-inversion vectors in place of their trigger words' tokens.
#include "engine/conditioning.h"
#include "engine/text_conditioner.h"

namespace sd {

namespace {

class ClipTextConditioner final : public TextConditioner {
public:
    ClipTextConditioner(LoadedStages& stages, const ClipTokenizer& tokenizer, const std::vector<Embedding>& embeddings,
                        long long* text_rows)
        : stages_(stages), tokenizer_(tokenizer), embeddings_(embeddings), text_rows_(text_rows) {}

    UnetConditioning encode(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                            const GenerateSettings& s) override {
        const ModelConfig& config = stages_.config();
        auto& te = stages_.text_encoder();
        check_text_encoder_features(te, config.text_encoder_path, s.clip_skip != 1, !embeddings_.empty());
        const at::Tensor extra = embedding_table(embeddings_, config.context_dim).to(stages_.device());
        auto encoder = [&](int64_t skip) -> TextEncodeFn {
            return [&, skip](const at::Tensor& ids) {
                *text_rows_ += ids.size(0);
                return LoadedStages::to_host(encode_ids(te, ids.to(stages_.device()), skip, extra));
            };
        };
        const auto added = added_words(embeddings_, token_table(te).size(0));
        auto [cond, uncond] = encode_conditioning(encoder(s.clip_skip - 1), encoder(0), tokenizer_, config, prompts,
                                                  negatives, {s.long_prompts, s.prompt_weights}, added);
        return {cond, uncond, {}, {}};
    }

private:
    LoadedStages& stages_;
    const ClipTokenizer& tokenizer_;
    const std::vector<Embedding>& embeddings_;
    long long* text_rows_;
};

}  // namespace

std::unique_ptr<TextConditioner> make_clip_conditioner(LoadedStages& stages, const ClipTokenizer& tokenizer,
                                                       const std::vector<Embedding>& embeddings, long long* text_rows) {
    return std::make_unique<ClipTextConditioner>(stages, tokenizer, embeddings, text_rows);
}

}  // namespace sd
