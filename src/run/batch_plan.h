// The plan of a txt2img run, before any tensor work: which prompts with which
// settings, in which batches and order, with which seeds and file names.
// Pure logic (no LibTorch, no files), so that it is quick to test.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sd/pipeline.h"
#include "sd/prompts.h"
#include "sd/txt2img.h"

namespace sd {

struct PlannedImage {
    int item = 0;       // index into RunPlan::items
    int iteration = 0;  // 0-based
    int index = 0;      // 0-based, generation order over the whole unsharded run
    uint64_t seed = 0;  // per-image: its own seed; compvis: the run's seed
    // Where its noise comes from in compvis mode: its batch's size, its place in
    // the batch (0-based) and how many batches drew from the run's generator before.
    int batch_size = 1, position = 0, batch_number = 0;
    std::string name;  // file name when names are fixed by a pattern; empty: numbered at write time
};

struct PlannedBatch {
    std::vector<PlannedImage> images;  // one per prompt; all share the items' settings
};

// Everything the run will do, in generation order, before sharding and skipping.
struct RunPlan {
    std::vector<PromptItem> items;
    std::vector<PlannedBatch> batches;
};

// Builds the plan: resolves per-line settings, forms batches (consecutive
// prompts with equal settings, at most n_samples; per-image seeds: one image a
// batch), numbers images and names them. Throws sd::Error for inconsistent
// options (e.g. --shard without per-image seeds) or duplicate names.
RunPlan plan_run(const Txt2ImgJob& job);

// The A1111-style "parameters" text: prompt, "Negative prompt: ..." when there
// is one, then "Steps: 50, Sampler: PLMS, CFG scale: 7.5, Seed: 42, Size: 512x512, Model: ...",
// everything that decides the image (sd/from_png.h reads it back), and "Version".
// The noise fields follow the web UI: "Variation seed", "Variation seed strength",
// "Seed resize from", "ENSD", "Eta" / "Eta DDIM", each only where it differs from
// the default, and "RNG: CPU" or "RNG: NV" always (the web UI leaves NV, the same
// numbers as its GPU default, unwritten; this tool's older texts have no "RNG" and mean cpu).
// model_hash: A1111's "Model hash" (the checkpoint's short hash), written when known.
// The hires fix's upscalers by A1111's names (PNG text "Hires upscaler"):
// latent "Latent", latent-nearest "Latent (nearest)", lanczos "Lanczos";
// the reverse gives "" for a name this tool does not have.
std::string hires_upscaler_a1111_name(const std::string& upscaler);
std::string hires_upscaler_from_a1111(const std::string& a1111_name);

std::string parameters_text(const PromptItem& item, const PlannedImage& img, SeedMode mode, const std::string& model,
                            const std::vector<EmbeddingInfo>& embeddings = {}, const std::string& model_hash = "");

// --schedule's names as AUTOMATIC1111's "Schedule type" writes them (default:
// "Uniform", the model's own sigmas; karras: "Karras"), and back ("" if unknown;
// "Automatic" is the sampler's default, the model's sigmas here).
std::string schedule_a1111_name(const std::string& schedule);
std::string schedule_from_a1111_name(const std::string& name);

// File name from a --name pattern: {index} (5 digits), {seed}, {prompt}
// (letters, digits, '-', '_', '.', at most 80 bytes); ".png" is added.
std::string expand_name(const std::string& pattern, int index, uint64_t seed, const std::string& prompt);
// Throws sd::Error when the pattern has an unknown placeholder, a '/' or is empty.
void check_name_pattern(const std::string& pattern);

}  // namespace sd
