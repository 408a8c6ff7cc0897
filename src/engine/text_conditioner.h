// Prompts to what the UNet is conditioned on, one implementation per model
// family, chosen once when the pipeline loads: SD 1.x/2.x (one CLIP text
// encoder, textual inversion, clip skip) and SDXL (two encoders, the pooled
// vector and the size embeddings).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/embeddings.h"
#include "engine/guidance.h"
#include "engine/loaded_stages.h"
#include "sd/tokenizer.h"

namespace sd {

class TextConditioner {
public:
    virtual ~TextConditioner() = default;
    // One prompt per conditional row (an image's, or each part of an A1111 composed
    // one), and one negative per image or none at all (no
    // guidance: the unconditional side is left undefined). The encoders load
    // on first use; the caller releases them (LoadedStages).
    virtual UnetConditioning encode(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                    const GenerateSettings& s) = 0;
};

// Every 77-token window the encoders run is added to *text_rows (--verbose).
std::unique_ptr<TextConditioner> make_clip_conditioner(LoadedStages& stages, const ClipTokenizer& tokenizer,
                                                       const std::vector<Embedding>& embeddings, long long* text_rows);
std::unique_ptr<TextConditioner> make_sdxl_conditioner(LoadedStages& stages, const ClipTokenizer& tokenizer,
                                                       const std::vector<Embedding>& embeddings, long long* text_rows);

}  // namespace sd
