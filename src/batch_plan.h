// The plan of a txt2img run, before any tensor work: which prompts with which
// settings, in which batches and order, with which seeds and file names.
// Pure logic (no LibTorch, no files), so that it is quick to test.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeline.h"
#include "prompts.h"

namespace sd {

enum class SeedMode {
    compvis,    // one generator seeded once for the run; each batch draws its noise in turn
    per_image,  // image i of the run gets its own generator seeded with seed + i
};

struct Shard {
    int k = 0, n = 1;  // this process does the prompts whose number % n == k
};

struct Txt2ImgJob {
    std::vector<PromptLine> prompts;  // from a file, or the one --prompt
    bool from_file = false;           // false: the one prompt, n_samples times per batch
    int n_samples = 1;
    int n_iter = 1;
    uint64_t seed = 42;
    SeedMode seed_mode = SeedMode::compvis;
    GenerateSettings settings;    // defaults; JSONL lines may override them
    std::string negative_prompt;  // replaces the unconditional ""
    std::string outdir = "outputs/txt2img-samples";
    std::string name_pattern;     // "{index}-{seed}-{prompt}"; empty: %05d after existing files
    bool skip_existing = false;
    Shard shard;
    bool grid = false;
    std::string save_latents;  // .npy path, empty for none
    std::string model_name;    // recorded in the metadata
};

// One prompt of the run with its settings resolved (flags, then its JSONL line).
struct PromptItem {
    std::string prompt, negative_prompt;
    GenerateSettings settings;
    int n_iter = 1;
    std::optional<uint64_t> seed;  // the line's own "seed"
    int number = 0;                // 0-based among the file's prompts (shards use it)
    int line = 0;                  // line in the file, 0 for --prompt
    std::string where;             // "FILE:LINE" or "--prompt", for messages
};

struct PlannedImage {
    int item = 0;       // index into RunPlan::items
    int iteration = 0;  // 0-based
    int index = 0;      // 0-based, generation order over the whole unsharded run
    uint64_t seed = 0;  // per-image: its own seed; compvis: the run's seed
    std::string name;   // file name when names are fixed by a pattern; empty: numbered at write time
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
// is one, then "Steps: 50, Sampler: PLMS, CFG scale: 7.5, Seed: 42, Size: 512x512, Model: ...".
std::string parameters_text(const PromptItem& item, uint64_t seed, SeedMode mode, int index, const std::string& model);

// File name from a --name pattern: {index} (5 digits), {seed}, {prompt}
// (letters, digits, '-', '_', '.', at most 80 bytes); ".png" is added.
std::string expand_name(const std::string& pattern, int index, uint64_t seed, const std::string& prompt);
// Throws sd::Error when the pattern has an unknown placeholder, a '/' or is empty.
void check_name_pattern(const std::string& pattern);

const char* seed_mode_name(SeedMode mode);

}  // namespace sd
