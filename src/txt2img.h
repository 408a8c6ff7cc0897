// A whole txt2img run as the CompVis script does it: prompts grouped into
// batches of n_samples, repeated n_iter times, one seeded generator for the
// run, images written under numbered names that never replace earlier files.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "pipeline.h"

namespace sd {

struct Txt2ImgJob {
    std::vector<std::string> prompts;  // from a file: one batch = n_samples consecutive prompts
    bool from_file = false;            // false: one prompt, repeated n_samples times per batch
    int n_samples = 1;
    int n_iter = 1;
    uint64_t seed = 42;
    GenerateSettings settings;
    std::string outdir = "outputs/txt2img-samples";
    std::string save_latents;  // .npy path, empty for none
};

struct Txt2ImgEvents {
    std::function<void(const std::string& path)> image_written;
    std::function<void(int batch, int batches, int step, int steps, double seconds_per_step)> step;
};

// Groups prompts into batches (the last one may be smaller).
std::vector<std::vector<std::string>> make_batches(const Txt2ImgJob& job);

// Runs the job; returns the paths written, in order. Throws sd::Error for
// input problems (checked before any work starts where possible).
std::vector<std::string> run_txt2img(Pipeline& pipeline, const Txt2ImgJob& job, const Txt2ImgEvents& events);

// The next free "%05d.png" number in dir (one past the highest existing).
int next_image_number(const std::string& dir);

}  // namespace sd
