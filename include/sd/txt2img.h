// A whole txt2img run as the CompVis script does it: prompts grouped into
// batches of n_samples, repeated n_iter times, images written under names that
// never replace earlier files. On top of it: per-line settings from JSON lines,
// per-image seeds, name patterns, resume (--skip-existing), shards, metadata.
// No LibTorch in here: the pipeline does the tensor work.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "sd/error.h"
#include "sd/pipeline.h"
#include "sd/progress.h"
#include "sd/prompts.h"

namespace sd {

enum class SeedMode {
    compvis,    // one generator seeded once for the run; each batch draws its noise in turn
    per_image,  // image i of the run gets its own generator seeded with seed + i
};

struct Shard {
    int k = 0, n = 1;  // this process does the prompts whose number % n == k
};

// "K/N", or "auto": from a Slurm job array (SLURM_ARRAY_TASK_ID, with
// SLURM_ARRAY_TASK_COUNT or _MIN/_MAX, and _STEP) or a Kubernetes Indexed Job
// (JOB_COMPLETION_INDEX with SD_SHARD_COUNT). Throws sd::Error otherwise.
Shard parse_shard(const std::string& text);
Shard shard_from_environment();

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
    std::string name_pattern;  // "{index}-{seed}-{prompt}"; empty: %05d after existing files
    bool skip_existing = false;
    Shard shard;
    bool grid = false;
    std::string save_latents;  // .npy path, empty for none
    std::string save_noise;    // .npy of every noise draw, [1 + D, n, C, h, w] (the pipeline must record_noise)
    std::string model_name;    // recorded in the metadata
    std::string model_hash;    // A1111's "Model hash": the checkpoint's SHA-256, first 10 digits; empty if unknown
    // The UNet's compute precision, recorded in the metadata ("Precision: bf16")
    // when not fp32, as it changes the picture; empty: fp32.
    std::string precision;
    // Remaking one image (--from-png): the first image's index (per-image seeds
    // are seed + index), and in compvis mode the one place of the batch to write.
    int first_index = 0;
    std::optional<int> keep_position;
    // Textual inversion (issue 19): the pipeline's embeddings, recorded as "TI hashes"
    // in the PNG text of the images whose prompts use them.
    std::vector<EmbeddingInfo> embeddings;
    // LoRA: --lora files (merged for every prompt, after the prompt's own tags)
    // and --lora-dir, where a prompt's <lora:NAME:W> tag finds NAME.safetensors.
    std::vector<LoraUse> loras;
    std::string lora_dir;
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

const char* seed_mode_name(SeedMode mode);

// Throws sd::Error for options that do not go together (--shard or
// --skip-existing without per-image seeds, duplicate names, ...), before any model loads.
void check_job(const Txt2ImgJob& job);
// The same, returning every LoRA file the job merges with its short hash (each
// file once, in the order of first use): what --from-png compares with the PNG's "Lora hashes".
std::vector<LoraUse> check_job_loras(const Txt2ImgJob& job);

// What was done with one image; also its JSON line and PNG text.
struct ImageRecord {
    std::string path;
    const PromptItem* item = nullptr;
    int index = 0;
    uint64_t seed = 0;
    SeedMode seed_mode = SeedMode::compvis;
    std::string model;
    double seconds = 0;      // generation time (a batch's time shared among its images)
    std::string parameters;  // the PNG's "parameters" text
};

struct Txt2ImgEvents {
    std::function<void(const ImageRecord&)> image_written;
    std::function<void(const ProgressInfo&)> progress;
    std::function<bool()> stop_requested;             // checked between sampler steps and between batches
    std::function<void(const std::string&)> note;     // informational messages (skipped files)
    std::function<void(const std::string&)> warning;  // what the user should hear even with --quiet
    // The --grid image: its path, its "parameters" text and how many images it shows.
    std::function<void(const std::string& path, const std::string& parameters, int images)> grid_written;
    // A preview image written (PipelineOptions::preview_every): OUTDIR/previews/NAME-stepNNN.png,
    // NAME the image's own name (or the number it is expected to get). Unset: no previews are made.
    std::function<void(const std::string& path)> preview_written;
};

struct Txt2ImgResult {
    std::vector<std::string> written;
    int planned = 0;  // images this process was to generate (its shard, existing ones skipped)
    int skipped = 0;  // existing images left alone (--skip-existing)
    bool interrupted = false;
};

// Runs the job. Throws sd::Error for input problems (checked before any work
// starts), RunFailure when writing fails midway; returns normally, with
// `interrupted` set, when stop_requested() said so.
Txt2ImgResult run_txt2img(Pipeline& pipeline, const Txt2ImgJob& job, const Txt2ImgEvents& events);

// The same for prompts that arrive one line at a time (--from-file -): each
// batch starts as soon as its lines have arrived (n_samples of them with the
// same settings, or the end of input) and its images are reported before the
// next line is read. Images, seeds and names are those run_txt2img gives for
// the same lines. Needs n_iter 1 (also in every line); each batch's lines are
// checked when they arrive, so a bad line stops the run after the batches before it.
Txt2ImgResult run_txt2img_stream(Pipeline& pipeline, const Txt2ImgJob& job, PromptReader& reader,
                                 const Txt2ImgEvents& events);

// The next free "%05d.png" number in dir (one past the highest existing).
int next_image_number(const std::string& dir);

}  // namespace sd
