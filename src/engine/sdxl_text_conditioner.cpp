// SDXL: CLIP ViT-L and OpenCLIP bigG side by side, bigG's pooled vector and
// the size embeddings as the UNet's vector input (sdxl_conditioning.h), and
// textual-inversion vectors (A1111's clip_l / clip_g pairs) in place of their
// trigger words' tokens in both encoders.
#include "engine/embeddings.h"
#include "engine/sdxl_conditioning.h"
#include "engine/text_conditioner.h"

namespace sd {

namespace {

class SdxlTextConditioner final : public TextConditioner {
public:
    SdxlTextConditioner(LoadedStages& stages, const ClipTokenizer& tokenizer, const std::vector<Embedding>& embeddings,
                        long long* text_rows)
        : stages_(stages), tokenizer_(tokenizer), embeddings_(embeddings), text_rows_(text_rows) {}

    UnetConditioning encode(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                            const GenerateSettings& s) override {
        const ModelConfig& config = stages_.config();
        auto& te1 = stages_.text_encoder();
        auto& te2 = stages_.text_encoder_2();
        const auto device = stages_.device();
        check_text_encoder_features(te1, config.text_encoder_path, false, !embeddings_.empty());
        const at::Tensor extra1 = embedding_table(embeddings_, config.sdxl.text_encoder_width).to(device);
        const at::Tensor extra2 = embedding_table(embeddings_, config.sdxl.text_encoder_2_width, true).to(device);
        auto encoders = [&](int64_t skip) {
            SdxlEncoders e;
            e.first = [&, skip](const at::Tensor& ids) {
                *text_rows_ += ids.size(0);
                return LoadedStages::to_host(encode_ids(te1, ids.to(device), skip, extra1));
            };
            e.second = [&, skip](const at::Tensor& ids) {
                *text_rows_ += ids.size(0);
                auto [hidden, pooled] = encode_ids_pooled(te2, ids.to(device), skip, extra2);
                return std::pair{LoadedStages::to_host(hidden), LoadedStages::to_host(pooled)};
            };
            return e;
        };
        // 0 means the reference's default: the image's own size.
        const SizeValues sizes = {s.original_height ? s.original_height : s.height,
                                  s.original_width ? s.original_width : s.width,
                                  s.crop_top,
                                  s.crop_left,
                                  s.target_height ? s.target_height : s.height,
                                  s.target_width ? s.target_width : s.width};
        // Both encoders number the added words alike, from the vocabulary's end, in load order
        // (diffusers' load_textual_inversion on each tokenizer).
        const auto added = added_words(embeddings_, token_table(te1).size(0));
        auto c = encode_sdxl_conditioning(encoders(s.clip_skip - 1), encoders(0), tokenizer_, config, prompts,
                                          negatives, {s.long_prompts, s.prompt_weights}, sizes, added);
        return {c.cond, c.uncond, c.cond_y, c.uncond_y};
    }

private:
    LoadedStages& stages_;
    const ClipTokenizer& tokenizer_;
    const std::vector<Embedding>& embeddings_;
    long long* text_rows_;
};

}  // namespace

std::unique_ptr<TextConditioner> make_sdxl_conditioner(LoadedStages& stages, const ClipTokenizer& tokenizer,
                                                       const std::vector<Embedding>& embeddings, long long* text_rows) {
    return std::make_unique<SdxlTextConditioner>(stages, tokenizer, embeddings, text_rows);
}

}  // namespace sd
