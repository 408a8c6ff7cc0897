#include "txt2img.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "error.h"
#include "fs_util.h"
#include "npy.h"

namespace sd {

std::vector<std::vector<std::string>> make_batches(const Txt2ImgJob& job) {
    if (job.n_samples < 1) throw Error("--n_samples must be at least 1");
    if (job.n_iter < 1) throw Error("--n_iter must be at least 1");
    if (job.prompts.empty()) throw Error("no prompt given (use --prompt or --from-file)");
    std::vector<std::vector<std::string>> batches;
    if (!job.from_file) {
        batches.emplace_back(static_cast<size_t>(job.n_samples), job.prompts.front());
    } else {
        for (size_t i = 0; i < job.prompts.size(); i += static_cast<size_t>(job.n_samples)) {
            auto end = std::min(job.prompts.size(), i + static_cast<size_t>(job.n_samples));
            batches.emplace_back(job.prompts.begin() + static_cast<long>(i), job.prompts.begin() + static_cast<long>(end));
        }
    }
    return batches;
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

std::vector<std::string> run_txt2img(Pipeline& pipeline, const Txt2ImgJob& job, const Txt2ImgEvents& events) {
    const auto batches = make_batches(job);
    pipeline.check(job.settings);
    ensure_writable_dir(job.outdir);

    pipeline.seed(job.seed);
    int number = next_image_number(job.outdir);
    const int total_batches = static_cast<int>(batches.size()) * job.n_iter;
    std::vector<std::string> written;
    std::vector<float> all_latents;
    std::vector<int64_t> latent_shape;
    int batch_index = 0;
    // CompVis order: iterations outside, batches inside.
    for (int it = 0; it < job.n_iter; ++it) {
        for (const auto& prompts : batches) {
            ++batch_index;
            auto start = std::chrono::steady_clock::now();
            ProgressFn progress = [&](int step, int steps) {
                double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                if (events.step) events.step(batch_index, total_batches, step, steps, secs / step);
            };
            BatchOutput out = pipeline.generate(prompts, job.settings, progress);
            for (const auto& img : out.images) {
                for (;;) {
                    char name[32];
                    std::snprintf(name, sizeof name, "%05d.png", number++);
                    const std::string path = join_path(job.outdir, name);
                    if (save_png_new(path, img)) {
                        written.push_back(path);
                        if (events.image_written) events.image_written(path);
                        break;
                    }
                }
            }
            if (!job.save_latents.empty()) {
                all_latents.insert(all_latents.end(), out.latents.begin(), out.latents.end());
                if (latent_shape.empty()) latent_shape = out.latent_shape;
                else latent_shape[0] += out.latent_shape[0];
            }
        }
    }
    if (!job.save_latents.empty())
        write_npy(job.save_latents, "<f4", latent_shape, all_latents.data(), all_latents.size() * sizeof(float));
    return written;
}

}  // namespace sd
