// A memory plan: the predicted peak of each stage and the configuration
// (stage loading, attention, UNet micro-batch, VAE tiling) chosen to fit a
// budget. The planner itself is src/memory/planner.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "sd/measurements.h"

namespace sd {

// How attention scores are computed: the values are the attention_mode
// attribute of the exported modules (docs/model-format.md).
enum class AttentionMode { Full = 0, PerHead = 1, Chunked = 2, Fused = 3 };

struct AttentionSetting {
    AttentionMode mode = AttentionMode::PerHead;
    int chunk = 256;  // query rows per chunk when mode == Chunked
};

// Parses "fused", "full", "per-head", "chunked" or "chunked:N"; throws sd::Error otherwise.
AttentionSetting parse_attention(const std::string& text);

// "4G", "4.5GiB", "3500M", "800MB", "123456" (bytes). Throws sd::Error.
double parse_size(const std::string& text);
std::string format_size(double bytes);  // "3.42 GiB"

// "" or a warning: a --max-memory of `max_memory` bytes above what the process's
// memory cgroup (a container, a batch job) lets it hold, where the kernel would
// kill the process before the plan's peak.
std::string max_memory_over_cgroup(double max_memory);

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
    AttentionMode attention_mode = AttentionMode::Chunked;
    int attention_chunk = 256;
    int unet_rows = 2;
    int vae_tile = 0;  // latent tile edge, 0 = whole image
    bool half_weights = false;
    // Conv weights in oneDNN's layout from load on (--prepack): faster, but
    // each prepacked conv copies its input and output into and out of that
    // layout, so the planner drops it before anything slower when memory is short.
    bool prepack = false;
    // With prepack: the 3x3 convolutions of the UNet's first `winograd_levels`
    // levels also held in Winograd form (AVX-512: oneDNN's, for this plan's size,
    // 2-3x faster, 4x their weights beside them; AVX2: the own route's, 1.6-1.9x,
    // 16/9 of their weights in their place); and a TAESD's, where this is not 0.
    int winograd_levels = 0;
    std::string compute;  // "fp32 on cpu, weights held in fp32": the pipeline's ComputeChoice, for describe()
    // Freed bytes the allocator may keep for reuse (block_cache.h): what 90%
    // of the budget leaves over the plan without it, at most the largest
    // stage's working set.
    double block_cache = 0;
    // Set by every plan (results change only by float rounding):
    int ff_chunk = 0;        // feed-forward tokens per call, 0 = all
    int64_t conv_split = 0;  // conv weight bytes per call, 0 = whole weight
    double base = 0;         // the process before any stage is loaded
    double budget = 0;
    bool budget_from_cgroup = false;  // the process's memory cgroup allowed less than the machine had
    StagePrediction text, unet, vae;
    // The VAE encoder (a batch that starts from a picture, or the hires fix's
    // lanczos pass): loaded for its encode and released after it, tiled as the
    // decoder is. encode false: no such stage.
    bool encode = false;
    StagePrediction enc;
    bool taesd = false;                  // a TAESD decodes instead of the VAE: no tiles, no attention
    double peak() const;                 // predicted peak of the whole run
    double resident_total() const;       // the base and every stage's weights but the encoder's
    std::string attention_name() const;  // "chunked:256", ...
    std::string describe() const;        // the --plan table
};

// The --verbose report (stderr lines): the plan, then predicted against
// measured peak of each stage, load times and the allocator's block reuse.
// On a GPU the prediction is of device memory, which host RSS does not see.
std::string measurement_report(const MemoryPlan& plan, const StagePeaks& measured, const StageTimes& times,
                               bool on_gpu);

}  // namespace sd
