// Text to image: tokenizer -> text encoder -> sampler over the UNet with
// classifier-free guidance -> VAE decoder -> 8-bit images.
// This header has no LibTorch in it, so the CLI compiles quickly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "image_io.h"
#include "model_config.h"

namespace sd {

class ClipTokenizer;

struct PipelineOptions {
    std::string model_dir;
    std::string attention = "per-head";  // full | per-head | chunked[:N]
    int threads = 0;                     // 0: one per core
};

struct GenerateSettings {
    std::string sampler = "plms";
    int steps = 50;
    double scale = 7.5;
    int height = 512, width = 512;
};

// Called after each sampler step: step (1-based) of total.
using ProgressFn = std::function<void(int step, int total)>;

struct BatchOutput {
    std::vector<Image> images;
    std::vector<float> latents;          // final latents of the batch, [n, C, h, w]
    std::vector<int64_t> latent_shape;
};

class Pipeline {
public:
    // Reads model.json and the tokenizer; the TorchScript stages load on first use.
    explicit Pipeline(const PipelineOptions& options);
    ~Pipeline();
    Pipeline(const Pipeline&) = delete;
    Pipeline& operator=(const Pipeline&) = delete;

    const ModelConfig& config() const;
    const ClipTokenizer& tokenizer() const;

    // Throws sd::Error when the model cannot run these settings (size, steps, sampler).
    void check(const GenerateSettings& s) const;

    // Seeds the run's generator; every batch then draws its start noise from it in turn.
    void seed(uint64_t seed);

    // One batch: one image per prompt.
    BatchOutput generate(const std::vector<std::string>& prompts, const GenerateSettings& s,
                         const ProgressFn& progress = nullptr);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace sd
