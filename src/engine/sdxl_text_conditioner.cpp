// SDXL: CLIP ViT-L and OpenCLIP bigG side by side, bigG's pooled vector and
// the size embeddings as the UNet's vector input (sdxl_conditioning.h).
#include "engine/sdxl_conditioning.h"
#include "engine/text_conditioner.h"

namespace sd {

namespace {

class SdxlTextConditioner final : public TextConditioner {
public:
    SdxlTextConditioner(LoadedStages& stages, const ClipTokenizer& tokenizer, long long* text_rows)
        : stages_(stages), tokenizer_(tokenizer), text_rows_(text_rows) {}

    UnetConditioning encode(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                            const GenerateSettings& s) override {
        auto& te1 = stages_.text_encoder();
        auto& te2 = stages_.text_encoder_2();
        const auto device = stages_.device();
        auto encoders = [&](int64_t skip) {
            SdxlEncoders e;
            e.first = [&, skip](const at::Tensor& ids) {
                *text_rows_ += ids.size(0);
                te1.setattr("clip_skip", skip);
                return LoadedStages::to_host(te1.forward({ids.to(device)}).toTensor());
            };
            e.second = [&, skip](const at::Tensor& ids) {
                *text_rows_ += ids.size(0);
                te2.setattr("clip_skip", skip);
                auto out = te2.run_method("forward_pooled", ids.to(device)).toTuple();
                return std::pair{LoadedStages::to_host(out->elements()[0].toTensor()),
                                 LoadedStages::to_host(out->elements()[1].toTensor())};
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
        auto c = encode_sdxl_conditioning(encoders(s.clip_skip - 1), encoders(0), tokenizer_, stages_.config(), prompts,
                                          negatives, {s.long_prompts, s.prompt_weights}, sizes);
        return {c.cond, c.uncond, c.cond_y, c.uncond_y};
    }

private:
    LoadedStages& stages_;
    const ClipTokenizer& tokenizer_;
    long long* text_rows_;
};

}  // namespace

std::unique_ptr<TextConditioner> make_sdxl_conditioner(LoadedStages& stages, const ClipTokenizer& tokenizer,
                                                       long long* text_rows) {
    return std::make_unique<SdxlTextConditioner>(stages, tokenizer, text_rows);
}

}  // namespace sd
