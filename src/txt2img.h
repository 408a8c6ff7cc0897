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

#include "batch_plan.h"
#include "error.h"
#include "pipeline.h"
#include "progress.h"

namespace sd {

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
    std::function<bool()> stop_requested;  // checked between sampler steps and between batches
    std::function<void(const std::string&)> note;  // informational messages (skipped files, grid)
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

// The next free "%05d.png" number in dir (one past the highest existing).
int next_image_number(const std::string& dir);

}  // namespace sd
