#include "sd/txt2img.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "sd/error.h"
#include "io/fs_util.h"
#include "io/image_io.h"
#include "io/npy.h"
#include "run/batch_plan.h"

namespace sd {

namespace {

using Clock = std::chrono::steady_clock;

// Thrown from the progress callback to abandon the batch being sampled.
struct Interrupted {};

int next_grid_number(const std::string& dir) {
    int next = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.size() != 13 || name.compare(0, 5, "grid-") != 0 || name.compare(9, 4, ".png") != 0) continue;
        if (name.find_first_not_of("0123456789", 5) != 9) continue;
        next = std::max(next, std::stoi(name.substr(5, 4)) + 1);
    }
    return next;
}

}  // namespace

void check_job(const Txt2ImgJob& job) { plan_run(job); }

int next_image_number(const std::string& dir) {
    int next = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.size() != 9 || name.compare(5, 4, ".png") != 0) continue;
        if (name.find_first_not_of("0123456789") != 5) continue;
        next = std::max(next, std::stoi(name.substr(0, 5)) + 1);
    }
    return next;
}

Txt2ImgResult run_txt2img(Pipeline& pipeline, const Txt2ImgJob& job, const Txt2ImgEvents& events) {
    const RunPlan plan = plan_run(job);
    const bool per_image = job.seed_mode == SeedMode::per_image;
    // Every setting must suit the model before anything runs; a file's line says which one does not.
    for (const auto& item : plan.items) {
        try {
            pipeline.check(item.settings);
        } catch (const Error& e) {
            if (item.line == 0) throw;
            throw Error(item.where + ": " + e.what());
        }
    }
    ensure_writable_dir(job.outdir);
    if (!job.save_latents.empty()) check_new_file_path(job.save_latents, "--save-latents");
    auto stop = [&] { return events.stop_requested && events.stop_requested(); };
    auto note = [&](const std::string& s) {
        if (events.note) events.note(s);
    };

    // This shard's images, less those already there when resuming.
    Txt2ImgResult result;
    std::vector<PlannedBatch> todo;
    for (const auto& b : plan.batches) {
        PlannedBatch keep;
        for (const auto& img : b.images) {
            if (plan.items[img.item].number % job.shard.n != job.shard.k) continue;
            if (!img.name.empty() && file_exists(join_path(job.outdir, img.name))) {
                if (!job.skip_existing)
                    throw Error(join_path(job.outdir, img.name) +
                                " already exists (--skip-existing resumes a run; or choose another --outdir or --name)");
                ++result.skipped;
                continue;
            }
            keep.images.push_back(img);
        }
        if (!keep.images.empty()) todo.push_back(std::move(keep));
    }
    if (result.skipped > 0)
        note("skipping " + std::to_string(result.skipped) + " image" + (result.skipped == 1 ? "" : "s") +
             " that already exist in " + job.outdir);

    const int timesteps = static_cast<int>(pipeline.config().alphas_cumprod.size());
    auto steps_run = [&](const GenerateSettings& s) { return sampler_step_count(s.sampler, s.steps, timesteps); };
    int64_t total_units = 0;  // image-steps, for the ETA
    for (const auto& b : todo) {
        result.planned += static_cast<int>(b.images.size());
        total_units += static_cast<int64_t>(b.images.size()) * steps_run(plan.items[b.images[0].item].settings);
    }

    if (!per_image) pipeline.seed(job.seed);
    int next_number = next_image_number(job.outdir);
    int64_t done_units = 0;
    double step_seconds = 0;  // time spent in sampler steps so far
    int images_done = 0;
    std::vector<float> all_latents;
    std::vector<int64_t> latent_shape;
    std::vector<Image> grid_images;

    for (const auto& batch : todo) {
        if (stop()) {
            result.interrupted = true;
            break;
        }
        const PromptItem& first = plan.items[batch.images[0].item];
        std::vector<std::string> prompts;
        for (const auto& img : batch.images) prompts.push_back(plan.items[img.item].prompt);
        const int n = static_cast<int>(prompts.size());
        if (per_image) pipeline.seed(batch.images[0].seed);

        const auto start = Clock::now();
        auto last = start;
        const int64_t units_before = done_units;
        ProgressFn progress = [&](int step, int steps) {
            const auto now = Clock::now();
            const double dt = std::chrono::duration<double>(now - last).count();
            last = now;
            step_seconds += dt;
            done_units += n;
            if (events.progress) {
                ProgressInfo info;
                info.first_image = images_done + 1;
                info.batch_images = n;
                info.total_images = result.planned;
                info.step = step;
                info.steps = steps;
                info.seconds_per_step = dt;
                info.eta_seconds = step_seconds / static_cast<double>(done_units) * static_cast<double>(total_units - done_units);
                events.progress(info);
            }
            if (stop()) throw Interrupted{};
        };
        BatchOutput out;
        try {
            out = pipeline.generate(prompts, first.settings, progress);
        } catch (const Interrupted&) {
            result.interrupted = true;
            break;
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / n;
        done_units = units_before + static_cast<int64_t>(n) * steps_run(first.settings);

        for (int k = 0; k < n; ++k) {
            const PlannedImage& img = batch.images[k];
            ImageRecord rec;
            rec.item = &plan.items[img.item];
            rec.index = img.index;
            rec.seed = img.seed;
            rec.seed_mode = job.seed_mode;
            rec.model = job.model_name;
            rec.seconds = seconds;
            rec.parameters = parameters_text(*rec.item, img.seed, job.seed_mode, img.index, job.model_name);
            try {
                if (!img.name.empty()) {
                    rec.path = join_path(job.outdir, img.name);
                    if (!save_png_new(rec.path, out.images[k], rec.parameters)) {
                        // Another process (a shard sharing the folder) made it meanwhile.
                        if (!job.skip_existing) throw RunFailure(rec.path + " appeared while running; not replaced");
                        note(rec.path + " appeared while running; kept it");
                        continue;
                    }
                } else {
                    // CompVis numbering: the next free number; link() never replaces a file.
                    for (;;) {
                        char name[32];
                        std::snprintf(name, sizeof name, "%05d.png", next_number++);
                        rec.path = join_path(job.outdir, name);
                        if (save_png_new(rec.path, out.images[k], rec.parameters)) break;
                    }
                }
            } catch (const Error& e) {
                throw RunFailure(e.what());
            }
            result.written.push_back(rec.path);
            if (events.image_written) events.image_written(rec);
        }
        images_done += n;
        if (!job.save_latents.empty()) {
            all_latents.insert(all_latents.end(), out.latents.begin(), out.latents.end());
            if (latent_shape.empty()) latent_shape = out.latent_shape;
            else latent_shape[0] += out.latent_shape[0];
        }
        if (job.grid) grid_images.insert(grid_images.end(), out.images.begin(), out.images.end());
    }
    // An interrupted run leaves only whole images; the latents and the grid would be partial.
    if (result.interrupted) return result;

    try {
        if (!job.save_latents.empty() && !all_latents.empty())
            write_npy(job.save_latents, "<f4", latent_shape, all_latents.data(), all_latents.size() * sizeof(float));
        if (job.grid && !grid_images.empty()) {
            bool same_size = std::all_of(grid_images.begin(), grid_images.end(), [&](const Image& im) {
                return im.width == grid_images[0].width && im.height == grid_images[0].height;
            });
            if (!same_size) {
                note("no grid: the images differ in size");
            } else {
                const Image grid = make_grid(grid_images, job.n_samples);
                for (int g = next_grid_number(job.outdir);; ++g) {
                    char name[32];
                    std::snprintf(name, sizeof name, "grid-%04d.png", g);
                    const std::string path = join_path(job.outdir, name);
                    if (save_png_new(path, grid)) {
                        note("grid: " + path);
                        break;
                    }
                }
            }
        }
    } catch (const Error& e) {
        throw RunFailure(e.what());
    }
    return result;
}

}  // namespace sd
