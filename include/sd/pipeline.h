// Text to image: tokenizer -> text encoder -> sampler over the UNet with
// classifier-free guidance -> VAE decoder -> 8-bit images.
// This header has no LibTorch in it, so the CLI compiles quickly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sd/image.h"
#include "sd/measurements.h"
#include "sd/memory_plan.h"
#include "sd/model_config.h"
#include "sd/settings.h"

namespace sd {

// Called with step 0 (and total 0) when sampling starts, the stages loaded and the
// prompts encoded, so that a step's time leaves loading out; then after each
// sampler step: step (1-based) of total. The hires fix's second pass starts again at 0.
using ProgressFn = std::function<void(int step, int total)>;

// Called every PipelineOptions::preview_every steps with the batch's current
// images: its predicted final latents (the denoised x0) through the preview TAESD.
using PreviewFn = std::function<void(int step, int total, const std::vector<Image>& images)>;

struct BatchOutput {
    std::vector<Image> images;
    std::vector<float> latents;  // final latents of the batch, [n, C, h, w]
    std::vector<int64_t> latent_shape;
    // With PipelineOptions::record_noise: the start noise, then every noise
    // tensor the sampler drew, as drawn, [1 + D, n, C, h, w] (--save-noise).
    std::vector<float> noise;
    std::vector<int64_t> noise_shape;
};

// Text to image over one exported model. An interface: its implementation is
// the LibTorch side (pipeline.cpp), which a program reaches through
// load_pipeline() (engine.h) so that it does not load LibTorch before it needs to.
class Pipeline {
public:
    virtual ~Pipeline() = default;

    virtual const ModelConfig& config() const = 0;
    virtual const ComputeChoice& compute() const = 0;

    // Throws sd::Error when the model cannot run these settings (size, steps, sampler).
    virtual void check(const GenerateSettings& s) const = 0;

    // The memory plan for a batch of `images` images with these settings.
    // Throws sd::Error when nothing fits the budget.
    virtual MemoryPlan plan(const GenerateSettings& s, int images) const = 0;

    // Peaks measured during the last generate().
    virtual const StagePeaks& measured() const = 0;
    virtual const StageTimes& timings() const = 0;

    // Seeds the run's generator; every batch then draws its start noise from it in turn.
    virtual void seed(uint64_t seed) = 0;

    // One batch: one image per prompt.
    virtual BatchOutput generate(const std::vector<std::string>& prompts, const GenerateSettings& s,
                                 const ProgressFn& progress = nullptr) = 0;

    // The textual-inversion embeddings loaded (PipelineOptions::embeddings).
    virtual std::vector<EmbeddingInfo> embeddings() const { return {}; }
    // Where previews go (PipelineOptions::preview_every); nullptr: none are made.
    virtual void set_preview(PreviewFn fn) = 0;
};

// Reads model.json, checks every stage's files from their headers and loads
// the tokenizer; the TorchScript stages load on first use. Throws sd::Error.
// Defined on the LibTorch side.
std::unique_ptr<Pipeline> make_pipeline(const PipelineOptions& options);

}  // namespace sd
