// The memory planner: predicts the peak resident memory of each stage from
// the model's architecture and picks stage loading, attention chunking, UNet
// micro-batch and VAE tiling so that the run fits a budget (or says up front
// how much it would need). The model of memory is derived in docs/memory.md
// and checked against measurements in docs/benchmarks.md.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "model_config.h"

namespace sd {

// "4G", "4.5GiB", "3500M", "800MB", "123456" (bytes). Throws sd::Error.
double parse_size(const std::string& text);
std::string format_size(double bytes);  // "3.42 GiB"

// What the user fixed; unset fields are the planner's to choose.
struct MemoryRequest {
    int height = 512, width = 512;
    int images = 1;                 // images in the largest batch of the run
    bool guidance = true;           // scale != 1: the UNet sees 2 rows per image
    double budget = 0;              // bytes; 0: what the machine has available
    std::optional<bool> sequential;           // --sequential-load on|off
    std::optional<int> attention_mode;        // 0 full, 1 per-head, 2 chunked
    std::optional<int> attention_chunk;
    std::optional<int> unet_rows;             // rows per UNet pass (2 per image with guidance)
    std::optional<int> vae_tile;              // latent tile edge; 0 = no tiling
    bool half_weights = false;                // --weights fp16: UNet and VAE weights held in fp16
};

struct StagePrediction {
    double weights = 0, activations = 0, scores = 0;
    // Activations still live while the attention scores are: all of them in
    // the UNet (its attention runs at the finest level), only the mid-block's
    // few tensors in the VAE decoder (its attention runs at the coarsest).
    double beside_scores = 0;
    double load = 0;  // peak while loading (the file, and the weights if they are converted)
    // Freed-block reuse (block_cache.h): the bytes the stage's freed blocks
    // reach when all are kept, the part of them that sits beside the stage's
    // peak, and that part under the plan's limit. The cache is emptied
    // between stages, so nothing is kept while a stage loads.
    double working_set = 0, share_at_peak = 0, kept = 0;
    // What the stage needs beyond its resident weights at its peak.
    double transient() const { return std::max(std::max(activations, beside_scores + scores) + kept, load - weights); }
    double total(double base) const { return base + weights + transient(); }
};

struct MemoryPlan {
    bool sequential = false;
    int attention_mode = 2, attention_chunk = 256;
    int unet_rows = 2;
    int vae_tile = 0;  // latent tile edge, 0 = whole image
    bool half_weights = false;
    std::string compute;  // "fp32 on cpu, weights held in fp32": the pipeline's ComputeChoice, for describe()
    // Freed bytes the allocator may keep for reuse (block_cache.h): what 90%
    // of the budget leaves over the plan without it, at most the largest
    // stage's working set.
    double block_cache = 0;
    // Set by every plan (results change only by float rounding):
    int ff_chunk = 0;          // feed-forward tokens per call, 0 = all
    int64_t conv_split = 0;    // conv weight bytes per call, 0 = whole weight
    double base = 0;   // the process before any stage is loaded
    double budget = 0;
    StagePrediction text, unet, vae;
    double peak() const;                  // predicted peak of the whole run
    std::string attention_name() const;   // "chunked:256", ...
    std::string describe() const;         // the --plan table
};

// Architecture constants of the memory model, read from model.json.
struct MemoryModel {
    double text_weights = 0, unet_weights = 0, vae_weights = 0;  // bytes (sizes of the .pt files)
    bool half_file = false;        // the .pt files hold fp16 weights
    int latent_channels = 4, downsample = 8;
    int model_channels = 320;
    double unet_skip_floats = 0;   // floats per latent pixel held in the UNet's skip list, per row
    double unet_largest_conv_bytes = 0;
    int attn_level = 0;            // finest UNet level with attention (-1: none)
    int attn_heads = 8;
    int vae_ch = 128;
    int vae_mid_channels = 512;
    int text_ctx = 77, text_width = 768, text_heads = 12;
};

MemoryModel memory_model(const ModelConfig& config);

// Bytes the machine can give now (MemAvailable).
double available_memory();

// Predicts one configuration.
MemoryPlan predict(const MemoryModel& m, const MemoryRequest& r, double base, const MemoryPlan& choice);

// Chooses the fastest configuration that fits r.budget; throws sd::Error with
// the smallest budget that would work when none fits.
MemoryPlan plan_memory(const MemoryModel& m, const MemoryRequest& r, double base);

}  // namespace sd
