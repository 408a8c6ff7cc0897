#include "sd/txt2img.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/schedule.h"
#include "io/fs_util.h"
#include "io/image_io.h"
#include "io/image_reader.h"
#include "io/npy.h"
#include "io/printable.h"
#include "io/sha256.h"
#include "run/batch_plan.h"
#include "sd/error.h"
#include "sd/loras.h"

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

namespace {

// Every LoRA the plan names exists, and its A1111 short hash is known (cached
// by path: a stream plans each batch on its own).
// The SHA-256 of each picture a prompt starts from (and its mask), for the PNG
// text; each file read once per plan.
void hash_pictures(RunPlan& plan) {
    std::map<std::string, std::string> hashes;
    auto hash_of = [&](const std::string& path, const std::string& what) {
        auto it = hashes.find(path);
        if (it != hashes.end()) return it->second;
        check_regular_file(path, what);
        return hashes.emplace(path, sha256_file_hex(path)).first->second;
    };
    for (auto& item : plan.items) {
        InitImage& init = item.settings.init;
        if (!init.active()) continue;
        init.image_hash = hash_of(init.path, "--init-img");
        if (!init.mask.empty()) init.mask_hash = hash_of(init.mask, "--mask");
    }
}

void hash_loras(RunPlan& plan, std::map<std::string, std::string>& hashes) {
    for (auto& item : plan.items) hash_lora_files(item.settings.loras, hashes);
}

}  // namespace

void check_job(const Txt2ImgJob& job) { check_job_loras(job); }

std::vector<LoraUse> check_job_loras(const Txt2ImgJob& job) {
    RunPlan plan = plan_run(job);
    std::map<std::string, std::string> hashes;
    hash_loras(plan, hashes);
    hash_pictures(plan);
    std::vector<LoraUse> used;
    for (const auto& item : plan.items)
        for (const auto& l : item.settings.loras)
            if (std::none_of(used.begin(), used.end(), [&](const LoraUse& u) { return u.path == l.path; }))
                used.push_back(l);
    return used;
}

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

namespace {

// Every setting must suit the model before anything runs; a file's line says which one does not.
void check_before_running(const Pipeline& pipeline, const Txt2ImgJob& job, const RunPlan& plan) {
    for (const auto& item : plan.items) {
        try {
            pipeline.check(item.settings);
        } catch (const Error& e) {
            // A LoRA named by the line's tag is reported with the line already.
            const std::string what = e.what();
            if (item.line == 0 || what.rfind(item.where + ": ", 0) == 0) throw;
            throw Error(item.where + ": " + what);
        }
    }
    ensure_writable_dir(job.outdir);
    if (!job.save_latents.empty()) check_new_file_path(job.save_latents, "--save-latents");
    if (!job.save_noise.empty()) check_new_file_path(job.save_noise, "--save-noise");
}

// This shard's images, less those already there when resuming (counted in `skipped`).
std::vector<PlannedBatch> select_work(const Txt2ImgJob& job, const RunPlan& plan, int& skipped) {
    std::vector<PlannedBatch> todo;
    for (const auto& b : plan.batches) {
        PlannedBatch keep;
        for (const auto& img : b.images) {
            if (plan.items[img.item].number % job.shard.n != job.shard.k) continue;
            if (!img.name.empty() && file_exists(join_path(job.outdir, img.name))) {
                if (!job.skip_existing)
                    throw Error(
                        join_path(job.outdir, img.name) +
                        " already exists (--skip-existing resumes a run; or choose another --outdir or --name)");
                ++skipped;
                continue;
            }
            keep.images.push_back(img);
        }
        if (!keep.images.empty()) todo.push_back(std::move(keep));
    }
    return todo;
}

// Progress over the whole run in image-steps (the steps each sampler really
// runs), and the ETA: the steps left at the time steps took so far, plus the
// batches left at the time each batch took besides its steps (decoding, writing,
// encoding the next prompts), measured from the first step on: the loading
// before it happens once.
class RunClock {
public:
    RunClock(const RunPlan& plan, const std::vector<PlannedBatch>& todo, int timesteps)
        : plan_(plan), timesteps_(timesteps), batches_(static_cast<int>(todo.size())) {
        for (const auto& b : todo) {
            images_ += static_cast<int>(b.images.size());
            total_units_ += static_cast<int64_t>(b.images.size()) * steps_of(b);
        }
    }
    int images() const { return images_; }

    void start_batch(const PlannedBatch& b) {
        n_ = static_cast<int>(b.images.size());
        batch_start_ = last_ = Clock::now();
        units_before_ = done_units_;
        steps_ = steps_of(b);
        ++batches_started_;
    }

    // Sampling starts: the next step's time counts from here, not from the loading before.
    void sampling_starts() {
        last_ = Clock::now();
        if (!first_sampling_) first_sampling_ = last_;
    }

    // After a sampler step: the report for it.
    ProgressInfo step(int step, int steps) {
        const auto now = Clock::now();
        const double dt = std::chrono::duration<double>(now - last_).count();
        last_ = now;
        step_seconds_ += dt;
        done_units_ += n_;
        ProgressInfo info;
        info.first_image = images_done_ + 1;
        info.batch_images = n_;
        info.total_images = images_;
        info.step = step;
        info.steps = steps;
        info.seconds_per_step = dt;
        info.eta_seconds = step_seconds_ / static_cast<double>(done_units_) *
                           static_cast<double>(std::max<int64_t>(0, total_units_ - done_units_));
        if (first_sampling_ && batches_started_ > 1) {
            // Time since the first step not spent in steps, per batch boundary crossed; this
            // batch's end and each later batch have one to come.
            const double between =
                std::max(0.0, std::chrono::duration<double>(now - *first_sampling_).count() - step_seconds_);
            info.eta_seconds += between / (batches_started_ - 1) * (batches_ - batches_started_ + 1);
        }
        return info;
    }

    // After the batch: each image's share of its time.
    double end_batch() {
        done_units_ = units_before_ + static_cast<int64_t>(n_) * steps_;
        images_done_ += n_;
        return std::chrono::duration<double>(Clock::now() - batch_start_).count() / n_;
    }

private:
    int steps_of(const PlannedBatch& b) const {
        const GenerateSettings& s = plan_.items[b.images[0].item].settings;
        const int first = sampler_step_count(s.sampler, s.schedule, s.steps, timesteps_);
        if (!s.hires.active()) return first;
        // The hires fix's second pass runs about its strength's share of its steps (img2img).
        const int second = s.hires.steps > 0 ? s.hires.steps : s.steps;
        return first +
               static_cast<int>(s.hires.strength * sampler_step_count(s.sampler, s.schedule, second, timesteps_));
    }

    const RunPlan& plan_;
    int timesteps_;
    int images_ = 0, images_done_ = 0, n_ = 0, steps_ = 0;
    int batches_ = 0, batches_started_ = 0;
    int64_t total_units_ = 0, done_units_ = 0, units_before_ = 0;
    double step_seconds_ = 0;  // time spent in sampler steps so far
    Clock::time_point batch_start_, last_;
    std::optional<Clock::time_point> first_sampling_;  // when the run's first sampling pass began
};

// The parameters text, with the compute precision where it is not fp32
// (after the rest: readers that do not know the key skip it).
std::string image_parameters(const Txt2ImgJob& job, const PromptItem& item, const PlannedImage& img) {
    std::string text = parameters_text(item, img, job.seed_mode, job.model_name, job.embeddings, job.model_hash);
    if (!job.precision.empty()) text += ", Precision: " + job.precision;
    return text;
}

// Writes one batch's images: under their fixed names, or the next free
// CompVis numbers (link() never replaces a file). Reports each written one.
void write_batch(const Txt2ImgJob& job, const RunPlan& plan, const PlannedBatch& batch, const BatchOutput& out,
                 double seconds, int& next_number, const Txt2ImgEvents& events, Txt2ImgResult& result) {
    for (size_t k = 0; k < batch.images.size(); ++k) {
        const PlannedImage& img = batch.images[k];
        if (job.keep_position && img.position != *job.keep_position) continue;
        ImageRecord rec;
        rec.item = &plan.items[img.item];
        rec.index = img.index;
        rec.seed = img.seed;
        rec.seed_mode = job.seed_mode;
        rec.model = job.model_name;
        rec.seconds = seconds;
        rec.parameters = image_parameters(job, *rec.item, img);
        try {
            if (!img.name.empty()) {
                rec.path = join_path(job.outdir, img.name);
                if (!save_png_new(rec.path, out.images[k], rec.parameters)) {
                    // Another process (a shard sharing the folder) made it meanwhile.
                    if (!job.skip_existing) throw RunFailure(rec.path + " appeared while running; not replaced");
                    if (events.note) events.note(rec.path + " appeared while running; kept it");
                    continue;
                }
            } else {
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
}

// What a whole run writes besides its images: the latents and the grid.
struct Extras {
    std::vector<float> latents;
    std::vector<int64_t> latent_shape;
    std::vector<Image> grid_images;
    std::string grid_parameters;     // the first image's, as AUTOMATIC1111 labels its grids
    std::vector<BatchOutput> noise;  // --save-noise: each batch's draws (only noise and noise_shape kept)

    void add(const Txt2ImgJob& job, const RunPlan& plan, const PlannedBatch& batch, const BatchOutput& out) {
        if (job.grid && grid_parameters.empty()) {
            const PlannedImage& first = batch.images.front();
            grid_parameters = image_parameters(job, plan.items[first.item], first);
        }
        if (!job.save_latents.empty()) {
            latents.insert(latents.end(), out.latents.begin(), out.latents.end());
            // A stream's lines are checked as they come: one .npy holds one shape.
            if (!latent_shape.empty() &&
                !std::equal(latent_shape.begin() + 1, latent_shape.end(), out.latent_shape.begin() + 1))
                throw Error("--save-latents needs every image the same size; a later line's size differs");
            if (latent_shape.empty())
                latent_shape = out.latent_shape;
            else
                latent_shape[0] += out.latent_shape[0];
        }
        if (job.grid) grid_images.insert(grid_images.end(), out.images.begin(), out.images.end());
        if (!job.save_noise.empty()) add_noise(out);
    }

    // One array for the run: the batches side by side along the image axis.
    void add_noise(const BatchOutput& out) {
        if (out.noise_shape.size() != 5) throw Error("--save-noise: the pipeline recorded no noise for a batch");
        if (!noise.empty()) {
            const auto& first = noise.front().noise_shape;
            if (out.noise_shape[0] != first[0])
                throw Error("--save-noise: the batches drew different numbers of noise tensors (" +
                            std::to_string(first[0]) + " and " + std::to_string(out.noise_shape[0]) +
                            "); one .npy holds one shape");
            if (!std::equal(first.begin() + 2, first.end(), out.noise_shape.begin() + 2))
                throw Error("--save-noise needs every image the same size; a later batch's size differs");
        }
        BatchOutput kept;
        kept.noise = out.noise;
        kept.noise_shape = out.noise_shape;
        noise.push_back(std::move(kept));
    }

    void write_noise(const std::string& path) const {
        std::vector<int64_t> shape = noise.front().noise_shape;
        shape[1] = 0;
        for (const auto& b : noise) shape[1] += b.noise_shape[1];
        const size_t image = static_cast<size_t>(shape[2] * shape[3] * shape[4]);
        std::vector<float> all;
        all.reserve(static_cast<size_t>(shape[0] * shape[1]) * image);
        for (int64_t d = 0; d < shape[0]; ++d)
            for (const auto& b : noise) {
                const size_t n = static_cast<size_t>(b.noise_shape[1]) * image;
                all.insert(all.end(), b.noise.begin() + static_cast<ptrdiff_t>(d * n),
                           b.noise.begin() + static_cast<ptrdiff_t>((d + 1) * n));
            }
        write_npy(path, "<f4", shape, all.data(), all.size() * sizeof(float));
    }

    void write(const Txt2ImgJob& job, const Txt2ImgEvents& events) const {
        if (!job.save_latents.empty() && !latents.empty())
            write_npy(job.save_latents, "<f4", latent_shape, latents.data(), latents.size() * sizeof(float));
        if (!job.save_noise.empty() && !noise.empty()) write_noise(job.save_noise);
        if (!job.grid || grid_images.empty()) return;
        const bool same_size = std::all_of(grid_images.begin(), grid_images.end(), [&](const Image& im) {
            return im.width == grid_images[0].width && im.height == grid_images[0].height;
        });
        if (!same_size) {
            if (events.note) events.note("no grid: the images differ in size");
            return;
        }
        const Image grid = make_grid(grid_images, job.n_samples);
        for (int g = next_grid_number(job.outdir);; ++g) {
            char name[32];
            std::snprintf(name, sizeof name, "grid-%04d.png", g);
            const std::string path = join_path(job.outdir, name);
            const std::string text = grid_parameters + ", Grid images: " + std::to_string(grid_images.size());
            if (save_png_new(path, grid, text)) {
                if (events.grid_written) events.grid_written(path, text, static_cast<int>(grid_images.size()));
                return;
            }
        }
    }
};

}  // namespace

namespace {

// Writes each preview of a batch under OUTDIR/previews, named after the image
// it shows (its own name, or the CompVis number it will most likely get).
PreviewFn preview_writer(const Txt2ImgJob& job, const PlannedBatch& batch, int next_number,
                         const Txt2ImgEvents& events) {
    return [&job, &batch, next_number, &events](int step, int, const std::vector<Image>& images) {
        const std::string dir = join_path(job.outdir, "previews");
        try {
            ensure_writable_dir(dir);
            for (size_t k = 0; k < images.size() && k < batch.images.size(); ++k) {
                std::string stem = batch.images[k].name;
                if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".png") == 0) stem.resize(stem.size() - 4);
                if (stem.empty() || stem.find('/') != std::string::npos) {
                    char num[16];
                    std::snprintf(num, sizeof num, "%05d", next_number + static_cast<int>(k));
                    stem = num;
                }
                char suffix[24];
                std::snprintf(suffix, sizeof suffix, "-step%03d.png", step);
                const std::string path = join_path(dir, stem + suffix);
                save_png_replace(path, images[k]);
                events.preview_written(path);
            }
        } catch (const Error& e) {
            throw RunFailure(std::string("cannot write a preview: ") + e.what());
        }
    };
}

// What a run carries from one plan to the next (a stream runs one plan per batch).
struct RunState {
    Txt2ImgResult result;
    int next_number = -1;  // the next CompVis file number; found once the folder is checked
    Extras extras;
    std::set<std::string> pictures_checked;  // for their EXIF orientation
    std::set<std::string> syntax_warned;     // extra-network tags not applied
};

// What viewers do to a picture with this EXIF orientation (2 to 8).
const char* orientation_meaning(int o) {
    static const char* const meaning[] = {"",
                                          "",
                                          "mirror it left to right",
                                          "turn it upside down",
                                          "mirror it top to bottom",
                                          "mirror it and turn it",
                                          "turn it 90 degrees clockwise",
                                          "mirror it and turn it",
                                          "turn it 90 degrees counter-clockwise"};
    return meaning[o];
}

// The prompt items of the images this run makes, each once, in order.
std::vector<const PromptItem*> items_made(const RunPlan& plan, const std::vector<PlannedBatch>& todo) {
    std::vector<const PromptItem*> out;
    std::set<int> seen;
    for (const auto& batch : todo)
        for (const auto& img : batch.images)
            if (seen.insert(img.item).second) out.push_back(&plan.items[img.item]);
    return out;
}

// What the user should hear before the images are made, once per file or tag a run:
// - a picture whose EXIF orientation tells viewers to turn or mirror it is used as
//   stored, as the references' PIL reads it;
// - a prompt's extra-network tags other than LoRA ones (a hypernetwork's, ...) are left
//   out of the text, as A1111 leaves them out, but nothing applies them.
void warn_before_making(const std::vector<const PromptItem*>& items, const Txt2ImgEvents& events, RunState& st) {
    if (!events.warning) return;
    for (const PromptItem* item : items) {
        const InitImage& init = item->settings.init;
        for (const auto& [path, what] : {std::pair{init.path, "--init-img"}, std::pair{init.mask, "--mask"}}) {
            if (!init.active() || path.empty() || !st.pictures_checked.insert(path).second) continue;
            const int o = exif_orientation_of_file(path);
            if (o < 2) continue;
            events.warning(std::string(what) + " " + path + ": its EXIF orientation is " + std::to_string(o) +
                           " (viewers " + orientation_meaning(o) +
                           "), which is not applied: the picture is used as stored, as the reference code reads "
                           "it; to use it as viewers show it, turn the file itself first (exiftran -ai, or "
                           "ImageMagick's mogrify -auto-orient)");
        }
        if (!item->settings.prompt_weights) continue;
        for (const auto& tag : unapplied_network_tags(item->prompt))
            if (st.syntax_warned.insert(tag).second)
                events.warning(item->where + ": " + printable(tag) +
                               " is an A1111 extra network that this tool does not apply (only <lora:...> and "
                               "<lyco:...> are); it is left out of the prompt, as A1111 leaves it out");
    }
}

// Runs this shard's batches of one plan (the generator seeded already in
// compvis mode); sets result.interrupted when told to stop.
void run_plan(Pipeline& pipeline, const Txt2ImgJob& job, const RunPlan& plan, const Txt2ImgEvents& events,
              RunState& st) {
    check_before_running(pipeline, job, plan);
    auto stop = [&] { return events.stop_requested && events.stop_requested(); };
    Txt2ImgResult& result = st.result;
    int skipped = 0;
    const std::vector<PlannedBatch> todo = select_work(job, plan, skipped);
    warn_before_making(items_made(plan, todo), events, st);
    result.skipped += skipped;
    if (skipped > 0 && events.note)
        events.note("skipping " + std::to_string(skipped) + " image" + (skipped == 1 ? "" : "s") +
                    " that already exist in " + job.outdir);
    RunClock clock(plan, todo, static_cast<int>(pipeline.config().alphas_cumprod.size()));
    result.planned += clock.images();
    if (st.next_number < 0) st.next_number = next_image_number(job.outdir);

    const bool per_image = job.seed_mode == SeedMode::per_image;
    for (const auto& batch : todo) {
        if (stop()) {
            result.interrupted = true;
            return;
        }
        std::vector<std::string> prompts;
        for (const auto& img : batch.images) {
            const PromptItem& item = plan.items[img.item];
            prompts.push_back(item.settings.prompt_weights ? strip_network_tags(item.prompt) : item.prompt);
        }
        if (per_image) pipeline.seed(batch.images[0].seed);
        clock.start_batch(batch);
        const ProgressFn progress = [&](int step, int steps) {
            if (step == 0) {
                clock.sampling_starts();
            } else {
                const ProgressInfo info = clock.step(step, steps);
                if (events.progress) events.progress(info);
            }
            if (stop()) throw Interrupted{};
        };
        if (events.preview_written) pipeline.set_preview(preview_writer(job, batch, st.next_number, events));
        BatchOutput out;
        try {
            out = pipeline.generate(prompts, plan.items[batch.images[0].item].settings, progress);
        } catch (const Interrupted&) {
            pipeline.set_preview(nullptr);
            result.interrupted = true;
            return;
        }
        pipeline.set_preview(nullptr);  // its writer refers to this batch
        const double seconds = clock.end_batch();
        write_batch(job, plan, batch, out, seconds, st.next_number, events, result);
        st.extras.add(job, plan, batch, out);
    }
}

// The latents and the grid, once the run is whole (an interrupted run leaves only whole images).
Txt2ImgResult finish_run(const Txt2ImgJob& job, const Txt2ImgEvents& events, RunState& st) {
    if (st.result.interrupted) return st.result;
    try {
        st.extras.write(job, events);
    } catch (const Error& e) {
        throw RunFailure(e.what());
    }
    return st.result;
}

}  // namespace

Txt2ImgResult run_txt2img(Pipeline& pipeline, const Txt2ImgJob& job, const Txt2ImgEvents& events) {
    RunPlan plan = plan_run(job);
    std::map<std::string, std::string> hashes;
    hash_loras(plan, hashes);
    hash_pictures(plan);
    RunState st;
    if (job.seed_mode != SeedMode::per_image) pipeline.seed(job.seed);
    run_plan(pipeline, job, plan, events, st);
    return finish_run(job, events, st);
}

Txt2ImgResult run_txt2img_stream(Pipeline& pipeline, const Txt2ImgJob& job, PromptReader& reader,
                                 const Txt2ImgEvents& events) {
    if (job.n_iter != 1) throw Error("a prompt stream needs --n_iter 1 (every iteration goes over the whole list)");
    const size_t cap = job.seed_mode == SeedMode::per_image ? 1 : static_cast<size_t>(job.n_samples);
    // The plan of these lines alone, numbered on from what the stream gave before.
    int number = 0, index = 0, batches = 0;
    std::map<std::string, std::string> hashes;
    auto plan_of = [&](const std::vector<PromptLine>& lines) {
        Txt2ImgJob part = job;
        part.prompts = lines;
        part.from_file = true;
        part.first_index = job.first_index + index;
        part.save_latents.clear();  // written once, at the end; its path was checked then
        part.save_noise.clear();
        RunPlan plan = plan_run(part);
        for (auto& item : plan.items) {
            item.number += number;
            if (item.n_iter != 1)
                throw Error(item.where + ": \"n_iter\" needs a prompt file; a stream is run as it arrives");
        }
        for (auto& b : plan.batches)
            for (auto& img : b.images) img.batch_number += batches;
        hash_loras(plan, hashes);
        hash_pictures(plan);
        return plan;
    };

    RunState st;
    if (!job.save_latents.empty()) check_new_file_path(job.save_latents, "--save-latents");
    if (!job.save_noise.empty()) check_new_file_path(job.save_noise, "--save-noise");
    if (job.seed_mode != SeedMode::per_image) pipeline.seed(job.seed);
    std::optional<PromptLine> pending = reader.next();
    if (!pending) throw Error("prompt file <stdin> holds no prompts");
    while (pending) {
        // A batch: the next lines with the same settings, until it is full or the input ends.
        // Once it is full nothing more is read, so a producer waiting for this batch's images is served.
        std::vector<PromptLine> lines = {std::move(*pending)};
        pending.reset();
        RunPlan plan = plan_of(lines);
        while (lines.size() < cap) {
            std::optional<PromptLine> next = reader.next();
            if (!next) break;
            lines.push_back(*next);
            RunPlan longer = plan_of(lines);
            if (longer.batches.size() != 1) {  // another batch's line: it starts the next one
                lines.pop_back();
                pending = std::move(next);
                break;
            }
            plan = std::move(longer);
        }
        run_plan(pipeline, job, plan, events, st);
        if (st.result.interrupted) break;
        number += static_cast<int>(lines.size());
        for (const auto& b : plan.batches) index += static_cast<int>(b.images.size());
        batches += static_cast<int>(plan.batches.size());
        if (!pending) pending = reader.next();
    }
    return finish_run(job, events, st);
}

}  // namespace sd
