// sd-txt2img: flags in, images out. Paths of written images go to stdout one
// per line; progress and messages go to stderr.
// Exit status: 0 done, 1 usage or input error, 2 runtime failure.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "error.h"
#include "fs_util.h"
#include "prompts.h"
#include "tokenizer.h"
#include "txt2img.h"

#ifndef SD_DEFAULT_MODEL_DIR
#define SD_DEFAULT_MODEL_DIR "models/demo"
#endif
#ifndef SD_DEFAULT_CLIP_DIR
#define SD_DEFAULT_CLIP_DIR "models/clip"
#endif

namespace {

int fail(int code, const std::string& message) {
    std::cerr << "sd-txt2img: error: " << message << "\n";
    return code;
}

void print_tokens(const sd::ClipTokenizer& tok, const std::vector<std::string>& prompts, int ctx, int bos, int eos, int pad) {
    for (const auto& p : prompts) {
        nlohmann::json ids = tok.encode_padded(p, ctx, bos, eos, pad);
        std::cout << ids.dump() << "\n";
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"sd-txt2img: Stable Diffusion text to image on a modest machine"};
    // A flag given twice takes its last value, as shell users expect when appending to a command.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    std::string model_dir = SD_DEFAULT_MODEL_DIR;
    std::string prompt, from_file, outdir = "outputs/txt2img-samples", save_latents, attention = "per-head";
    std::string sampler = "plms";
    sd::Txt2ImgJob job;
    bool plms = false, tokenize = false, quiet = false;
    int threads = 0;
    long long seed = 42;

    app.add_option("--model", model_dir, "exported model folder (scripts/export_model.py)");
    app.add_option("--prompt", prompt, "the prompt");
    app.add_option("--from-file", from_file, "prompts from a file: one a line, or .jsonl with \"prompt\"; - for stdin");
    app.add_option("--steps,--ddim_steps", job.settings.steps, "sampler steps")->capture_default_str();
    app.add_option("--seed", seed, "seed of the run's generator")->capture_default_str();
    app.add_option("--H", job.settings.height, "image height in pixels")->capture_default_str();
    app.add_option("--W", job.settings.width, "image width in pixels")->capture_default_str();
    app.add_option("--scale", job.settings.scale, "classifier-free guidance scale")->capture_default_str();
    app.add_option("--n_samples", job.n_samples, "images per batch")->capture_default_str();
    app.add_option("--n_iter", job.n_iter, "times to repeat every batch")->capture_default_str();
    app.add_option("--sampler", sampler, "plms or ddim")->capture_default_str();
    app.add_flag("--plms", plms, "same as --sampler plms (CompVis name)");
    app.add_option("--outdir", outdir, "output folder")->capture_default_str();
    app.add_option("--save-latents", save_latents, "write the run's final latents to this .npy file");
    app.add_option("--attention", attention, "full, per-head or chunked[:N]")->capture_default_str();
    app.add_option("--threads", threads, "CPU threads (0: one per core)")->capture_default_str();
    app.add_flag("--tokenize", tokenize, "print each prompt's 77 token ids as a JSON array and exit");
    app.add_flag("--quiet,-q", quiet, "no progress on stderr");

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return fail(1, e.what());
    }

    try {
        if (!prompt.empty() && !from_file.empty()) throw sd::Error("give either --prompt or --from-file, not both");
        bool have_prompt = app.count("--prompt") > 0;
        if (!from_file.empty()) {
            for (auto& line : sd::read_prompt_file(from_file)) job.prompts.push_back(line.prompt);
            job.from_file = true;
        } else if (have_prompt) {
            job.prompts.push_back(prompt);
        } else {
            throw sd::Error("no prompt given (use --prompt \"...\" or --from-file FILE)");
        }

        if (tokenize) {
            const bool own_model = app.count("--model") > 0;
            if (own_model) {
                auto cfg = sd::load_model_config(model_dir);
                auto tok = sd::ClipTokenizer::load(cfg.vocab_path, cfg.merges_path);
                print_tokens(tok, job.prompts, cfg.context_length, cfg.bos_id, cfg.eos_id, cfg.pad_id);
            } else {
                const std::string dir = SD_DEFAULT_CLIP_DIR;
                auto tok = sd::ClipTokenizer::load(sd::join_path(dir, "vocab.json"), sd::join_path(dir, "merges.txt"));
                print_tokens(tok, job.prompts, 77, 49406, 49407, 49407);
            }
            return 0;
        }

        if (plms) sampler = "plms";
        job.settings.sampler = sampler;
        if (seed < 0) throw sd::Error("--seed must not be negative");
        job.seed = static_cast<uint64_t>(seed);
        job.outdir = outdir;
        job.save_latents = save_latents;

        sd::PipelineOptions options;
        options.model_dir = model_dir;
        options.attention = attention;
        options.threads = threads;
        sd::Pipeline pipeline(options);

        sd::Txt2ImgEvents events;
        events.image_written = [](const std::string& path) { std::cout << path << std::endl; };
        if (!quiet) {
            events.step = [](int batch, int batches, int step, int steps, double sps) {
                std::fprintf(stderr, "batch %d/%d  step %d/%d  %.2f s/step\n", batch, batches, step, steps, sps);
            };
        }
        sd::run_txt2img(pipeline, job, events);
        return 0;
    } catch (const sd::Error& e) {
        return fail(1, e.what());
    } catch (const std::exception& e) {
        return fail(2, e.what());
    }
}
