// sd-txt2img: flags in, images out. stdout carries only data, one line per
// written image (its path, or a JSON object with --json); progress and
// messages go to stderr.
// Exit status: 0 done, 1 usage or input error, 2 runtime failure, 130 interrupted.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>

#include "sd/dry_run.h"
#include "sd/engine.h"
#include "sd/error.h"
#include "sd/from_png.h"
#include "sd/loras.h"
#include "sd/model_cache.h"
#include "sd/model_hash.h"
#include "sd/noise_rules.h"
#include "sd/progress.h"
#include "sd/prompts.h"
#include "sd/records.h"
#include "sd/tokenizer.h"
#include "sd/txt2img.h"
#include "sd/value_rules.h"
#include "sd/version.h"

#ifndef SD_DEFAULT_MODEL_DIR
#define SD_DEFAULT_MODEL_DIR "models/demo"
#endif
#ifndef SD_TORCH_VERSION
#define SD_TORCH_VERSION "unknown"
#endif
#ifndef SD_DEFAULT_CLIP_DIR
#define SD_DEFAULT_CLIP_DIR "models/clip"
#endif

namespace {

constexpr int kExitInterrupted = 130;

int fail(int code, const std::string& message) {
    std::cerr << "sd-txt2img: error: " << message << "\n";
    return code;
}

// Every line of data goes through here: a write that fails (a full disk, a
// closed file) ends the run with exit 2 instead of losing the records quietly.
void print_data_line(const std::string& line) {
    std::cout << line << '\n';
    std::cout.flush();
    if (!std::cout) {
        const int err = errno;
        throw sd::RunFailure(std::string("cannot write to standard output: ") + std::strerror(err ? err : EIO));
    }
}

void print_tokens(const sd::ClipTokenizer& tok, const std::vector<std::string>& prompts, const sd::ModelConfig& c) {
    for (const auto& p : prompts)
        print_data_line(sd::token_ids_json(tok.encode_padded(p, c.context_length, c.bos_id, c.eos_id, c.pad_id)));
}

// SIGINT/SIGTERM only set this flag; the run checks it between sampler steps
// and between images, so it stops without leaving a partial file. The handler
// resets itself: a second Ctrl-C ends the process at once.
volatile sig_atomic_t g_stop = 0;
volatile sig_atomic_t g_bar_on_stderr = 0;  // start the message on a fresh line

void on_stop_signal(int) {
    g_stop = 1;
    const char msg[] = "\nsd-txt2img: stopping after the current step (press Ctrl-C again to quit at once)\n";
    const int skip = g_bar_on_stderr ? 0 : 1;
    ssize_t ignored = ::write(2, msg + skip, sizeof msg - 1 - skip);
    (void)ignored;
}

void install_stop_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// The model's name for the metadata: its checkpoint's file name without extension, else the folder's name.
std::string model_name(const sd::ModelConfig& cfg, const std::string& model_dir) {
    std::string name = cfg.source;
    if (name.empty()) {
        name = model_dir;
        while (name.size() > 1 && name.back() == '/') name.pop_back();
    }
    name = name.substr(name.find_last_of('/') == std::string::npos ? 0 : name.find_last_of('/') + 1);
    const size_t dot = name.find_last_of('.');
    if (dot != std::string::npos && dot > 0) name.erase(dot);
    return name;
}

// Numbers from flags follow the same rules as those from JSONL lines (value_rules.h).
void check_numeric_flags(const CLI::App& app, const sd::Txt2ImgJob& job, int batch_size, int threads) {
    sd::check_whole("--steps", job.settings.steps, sd::kStepsRange);
    if (app.count("--H")) sd::check_whole("--H", job.settings.height, sd::kSideRange);
    if (app.count("--W")) sd::check_whole("--W", job.settings.width, sd::kSideRange);
    if (app.count("--scale")) sd::check_scale("--scale", job.settings.scale);
    sd::check_whole("--n_samples", job.n_samples, sd::kSamplesRange);
    sd::check_whole("--n_iter", job.n_iter, sd::kIterRange);
    if (app.count("--batch-size")) sd::check_whole("--batch-size", batch_size, sd::kSamplesRange);
    sd::check_threads(threads);
    sd::check_clip_skip("--clip-skip", job.settings.clip_skip, 0);  // the model's layers: Pipeline::check
}

// "auto" -> unset (the planner decides), "on" -> true, "off" -> false.
std::optional<bool> parse_switch(const std::string& flag, const std::string& v) {
    if (v == "auto") return std::nullopt;
    if (v == "on") return true;
    if (v == "off") return false;
    throw sd::Error(flag + " takes auto, on or off, not '" + v + "'");
}

// --vae-tiling: auto (planner), off (0), on (tiles of 32 latent px = 256 px), or a tile edge.
std::optional<int> parse_tiling(const std::string& v) {
    if (v == "auto") return std::nullopt;
    if (v == "off") return 0;
    if (v == "on") return 32;
    if (!v.empty() && v.size() < 6 && v.find_first_not_of("0123456789") == std::string::npos && std::stoi(v) >= 4)
        return std::stoi(v);
    throw sd::Error("--vae-tiling takes auto, on, off or a tile edge of at least 4 latent pixels, not '" + v + "'");
}

// Every flag's raw value; what they mean is decided by the library.
struct Flags {
    std::string model_dir = SD_DEFAULT_MODEL_DIR;
    std::string prompt, from_file, outdir = "outputs/txt2img-samples", save_latents, shard;
    std::string sampler = sd::default_sampler(), seed = "42", seed_mode = "compvis", prompt_syntax = "a1111";
    bool plms = false, tokenize = false, quiet = false, json = false, show_plan = false, verbose = false,
         version = false;
    std::vector<std::string> from_png;
    std::vector<sd::RecordedImage> recorded;  // what each --from-png file records, read before the model loads
    bool ignore_hash_mismatch = false;
    bool from_png_lenient = false;  // skip the fields a PNG records that this tool cannot honour
    bool dry_run = false;           // print the jobs, run nothing
    std::string manifest;
    std::string attention = "auto", max_memory, sequential_load = "auto", vae_tiling = "auto", prepack = "auto",
                winograd = "auto";
    std::string precision = "auto", weights = "auto", device = "auto";
    int batch_size = 0, threads = 0;
    std::vector<std::string> embeddings;  // textual inversion (issue 19)
    std::string embeddings_dir;
    // Decoders and VAE weights at run time (docs/community-models.md "TAESD and a standalone VAE").
    std::string vae_decoder, preview_decoder, vae;
    int preview = 0;
    sd::Txt2ImgJob job;  // the flags that map onto it directly
    // LoRA: --lora FILE[:WEIGHT], repeatable (--lora-dir goes into job).
    std::vector<std::string> loras;
    // SDXL's size conditioning (WxH, TOP,LEFT, WxH); empty: the reference's defaults.
    std::string original_size, crop_coords, target_size;
    // The web UI's noise (issue 35): --rng, --subseed, --seed-resize-from as given; --ensd and the strength in job.
    std::string rng = "cpu", subseed, seed_resize_from, save_noise;
    // --model FILE: a checkpoint or diffusers folder, exported once into the model cache.
    std::string model_cache;
    std::vector<std::string> export_args;
    bool model_cache_list = false, model_cache_clear = false;
    std::string model_display_name;  // the checkpoint's name, when --model came through the cache
    std::string hires_size;          // --hires-size WxH
};

void add_flags(CLI::App& app, Flags& f) {
    sd::Txt2ImgJob& job = f.job;
    app.add_option("--model", f.model_dir,
                   "exported model folder, or a checkpoint (.safetensors, .ckpt, .gguf) or diffusers folder, exported "
                   "on first use into the model cache");
    app.add_option("--model-cache", f.model_cache,
                   "the model cache's folder (default $XDG_CACHE_HOME/sd-txt2img/models, else "
                   "~/.cache/sd-txt2img/models)");
    app.add_option("--export-arg", f.export_args,
                   "an argument for the one-time export of a --model checkpoint, e.g. --export-arg=--dtype=float16 "
                   "(repeatable; after those of its side file NAME.export.json)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false);
    app.add_flag("--model-cache-list", f.model_cache_list,
                 "list the model cache's entries (folder, size, checkpoint hash, sources) and exit");
    app.add_flag("--model-cache-clear", f.model_cache_clear,
                 "remove every entry of the model cache and the leftovers of interrupted exports, and exit");
    app.add_option("--prompt", f.prompt, "the prompt");
    app.add_option(
        "--from-file", f.from_file,
        "prompts from a file: one a line, or .jsonl objects with \"prompt\" and per-line settings; - for stdin");
    app.add_option("--prompt-syntax", f.prompt_syntax,
                   "a1111: (weights), [less], BREAK and prompts over 75 tokens in more windows; "
                   "plain: CompVis exactly (plain text, cut at 77 tokens)")
        ->capture_default_str();
    app.add_option("--from-png", f.from_png,
                   "remake the images these PNGs record (their parameters text); flags given as well override it")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_flag("--ignore-hash-mismatch", f.ignore_hash_mismatch,
                 "--from-png: remake even when a LoRA or embedding file differs from the one the PNG recorded (its "
                 "Lora hashes / TI hashes), with a warning; without it such a PNG is refused");
    app.add_flag("--from-png-lenient", f.from_png_lenient,
                 "--from-png: remake a PNG whose text has fields this tool cannot honour (a sampler it lacks, hires "
                 "fix, RNG: std_default, ...) without them, naming them on stderr; without it such a PNG is refused");
    app.add_option("--negative-prompt", job.negative_prompt,
                   "what the image should not show (replaces the unconditional \"\")");
    app.add_option("--steps,--ddim_steps", job.settings.steps, "sampler steps")->capture_default_str();
    app.add_option("--seed", f.seed,
                   "seed, 0 to 18446744073709551615, or -1 for a random one (recorded; refused with --shard, "
                   "--skip-existing and a --manifest that holds lines, which need one seed for the whole set)")
        ->capture_default_str();
    app.add_option("--seed-mode", f.seed_mode,
                   "compvis: one generator for the run; per-image: image i gets its own generator seeded seed + i")
        ->capture_default_str();
    app.add_option("--H", job.settings.height,
                   "image height in pixels (default: the size the model was trained at, else 512)");
    app.add_option("--W", job.settings.width,
                   "image width in pixels (default: the size the model was trained at, else 512)");
    app.add_option("--scale", job.settings.scale, "classifier-free guidance scale (default: the model's, else 7.5)");
    app.add_option("--init-img", job.settings.init.path,
                   "start from this picture (PNG, JPEG or BMP): img2img; with --mask or --outpaint, inpainting");
    app.add_option("--strength", job.settings.init.strength,
                   "with --init-img: the part of the schedule that runs, more than 0 and at most 1 (A1111's denoising "
                   "strength)")
        ->capture_default_str();
    app.add_option("--mask", job.settings.init.mask,
                   "with --init-img: a picture of the same size whose white part is repainted (grey 128 and up counts "
                   "as white)");
    app.add_option("--mask-blur", job.settings.init.mask_blur, "blur the mask by this radius in pixels (A1111's)")
        ->capture_default_str();
    app.add_flag("--invert-mask", job.settings.init.invert_mask, "repaint the black part of the mask instead");
    app.add_option("--outpaint", job.settings.init.outpaint,
                   "LEFT,TOP,RIGHT,BOTTOM: extend the --init-img picture by that many pixels and paint the new area");
    app.add_option("--resize-mode", job.settings.init.resize_mode,
                   "a picture of another size than --W x --H: just (stretch), crop (cover, cut the middle) or fill "
                   "(fit, stretch the edges into the bands)")
        ->capture_default_str();
    app.add_option("--masked-content", job.settings.init.masked_content,
                   "what the masked area holds before sampling: original, fill (the kept colours blurred in, "
                   "A1111's), latent-noise (the start noise) or latent-nothing (zero latents)")
        ->capture_default_str();
    app.add_option("--hires-scale", job.settings.hires.scale,
                   "hires fix (A1111's): make the image at --W x --H, upscale it F times, then run img2img at that "
                   "size with the same prompt, seed and sampler");
    app.add_option("--hires-size", f.hires_size, "hires fix to WxH instead of --hires-scale (stretched to it)");
    app.add_option("--hires-steps", job.settings.hires.steps,
                   "hires fix: the second pass's --steps (0: the first pass's)")
        ->capture_default_str();
    app.add_option("--hires-strength", job.settings.hires.strength,
                   "hires fix: the second pass's strength (A1111's denoising strength)")
        ->capture_default_str();
    app.add_option("--hires-upscaler", job.settings.hires.upscaler,
                   "hires fix: latent (bilinear on the latents), latent-nearest, or lanczos (the decoded image "
                   "resized, then encoded again)")
        ->capture_default_str();
    app.add_option("--n_samples", job.n_samples, "images per batch")->capture_default_str();
    app.add_option("--n_iter", job.n_iter, "times to repeat every batch")->capture_default_str();
    app.add_option("--sampler", f.sampler,
                   sd::sampler_choices() +
                       ", or the web UI's name as its PNGs write it (\"Euler a\", \"DPM++ 2M SDE\", \"DPM++ 2M "
                       "Karras\"...; docs/cli.md)")
        ->capture_default_str();
    app.add_option("--schedule", job.settings.schedule,
                   "k-diffusion samplers' sigmas: default (the web UI's Uniform), karras, exponential, "
                   "polyexponential, sgm_uniform, kl_optimal, align_your_steps, simple, normal, ddim or beta, or "
                   "diffusers' schedulers: leading, or trailing for euler and euler_a (the Turbo recipe); PLMS/DDIM "
                   "timesteps: default (CompVis), leading or trailing (any --steps); lcm: default only; automatic: "
                   "the web UI's choice for the sampler; the web UI's names (\"Karras\", \"Align Your Steps\") too")
        ->capture_default_str();
    app.add_option("--beta-alpha", job.settings.beta_alpha, "--schedule beta: the distribution's alpha (the web UI's)")
        ->capture_default_str();
    app.add_option("--beta-beta", job.settings.beta_beta, "--schedule beta: the distribution's beta (the web UI's)")
        ->capture_default_str();
    app.add_option("--brownian-tree", job.settings.noise.brownian_tree,
                   "SDE samplers' noise: a1111, one Brownian tree per image seeded with its seed (the web UI's), or "
                   "kdiffusion, one tree for the batch seeded by a draw after the start noise (k-diffusion's own)")
        ->capture_default_str();
    app.add_flag("--plms", f.plms, "same as --sampler " + sd::default_sampler() + " (CompVis's flag)");
    app.add_option("--outdir", f.outdir, "output folder")->capture_default_str();
    app.add_option("--name", job.name_pattern,
                   "file name pattern with {index} {seed} {prompt} (default: 00000.png, ... after existing files)");
    app.add_flag("--grid", job.grid, "also write a grid of the run's images (grid-0000.png)");
    app.add_flag("--skip-existing", job.skip_existing,
                 "resume: leave images whose file exists (needs --seed-mode per-image)");
    app.add_option("--shard", f.shard,
                   "K/N: only prompts number p with p % N == K (needs --seed-mode per-image); auto: K and N from "
                   "Slurm's SLURM_ARRAY_TASK_ID/_COUNT or JOB_COMPLETION_INDEX with SD_SHARD_COUNT");
    app.add_option(
        "--manifest", f.manifest,
        "append one JSON line per written image (index, prompt, seed, parameters, model hash, path, status); "
        "an existing file must be such a manifest, and it must not be a .png in --outdir");
    app.add_flag("--json", f.json, "print one JSON object per image instead of its path");
    app.add_option("--save-latents", f.save_latents, "write the run's final latents to this .npy file");
    // The web UI's noise (docs/batches.md "The web UI's noise").
    app.add_option("--rng", f.rng,
                   "noise source: cpu (LibTorch's CPU generator) or nv (the web UI's imitation of an NVIDIA GPU's, "
                   "its default; with --seed-mode per-image each image has its own, as there)")
        ->capture_default_str();
    app.add_option("--ensd", job.settings.noise.ensd,
                   "eta noise seed delta (the web UI's ENSD): the sampler's draws come from a generator seeded "
                   "seed + N")
        ->capture_default_str();
    app.add_option("--subseed", f.subseed, "variation seed (the web UI's), blended in by --subseed-strength");
    app.add_option("--subseed-strength", job.settings.noise.subseed_strength,
                   "how far the start noise moves toward the --subseed's, 0 to 1 (slerp, as the web UI)")
        ->capture_default_str();
    app.add_option("--seed-resize-from", f.seed_resize_from,
                   "WxH: the web UI's \"resize seed from\": the noise drawn at this size, pasted centred");
    app.add_option("--save-noise", f.save_noise,
                   "write the start noise and every noise tensor the sampler drew to this .npy, [1 + D, n, 4, H/8, "
                   "W/8]");
    // Memory: see docs/memory.md and docs/cli.md. Unset choices are left to the planner.
    app.add_option("--attention", f.attention, "auto, fused, full, per-head or chunked[:N]")->capture_default_str();
    app.add_option("--max-memory", f.max_memory,
                   "memory budget, e.g. 4G (default: what the machine, and the memory cgroup of a container or batch "
                   "job, has available)");
    app.add_option(
           "--prepack", f.prepack,
           "auto or on: convolution weights in oneDNN's layout from load on (fp32 on a CPU); off: as in the file")
        ->capture_default_str();
    app.add_option("--winograd", f.winograd,
                   "auto, on or off: the 3x3 convolutions of the UNet's first two levels, of a TAESD and of "
                   "the VAE by Winograd (fp32, prepacked, AVX2 or AVX-512; with --precision bf16 on avx512_bf16 "
                   "without AMX, the UNet's and the VAE's larger ones); auto: the UNet's when memory allows")
        ->capture_default_str();
    app.add_option("--sequential-load", f.sequential_load, "auto, on (one stage in memory at a time) or off")
        ->capture_default_str();
    app.add_option("--batch-size", f.batch_size, "images per UNet pass (default: the planner decides)");
    app.add_option("--vae-tiling", f.vae_tiling, "auto, on, off, or a tile edge in latent pixels")
        ->capture_default_str();
    app.add_option("--device", f.device, "auto (cuda if available), cpu, cuda or cuda:N")->capture_default_str();
    app.add_option("--precision", f.precision,
                   "UNet and VAE compute: auto (fp16 on cuda, fp32 on cpu), fp32, fp16 or bf16 (the text encoder too)")
        ->capture_default_str();
    app.add_option("--weights", f.weights,
                   "how the UNet and VAE weights are held: auto (as computed; a --dtype q8_0 export's UNet as "
                   "stored), fp32, fp16, or q8 (UNet in 8-bit blocks, GGUF q8_0; VAE fp32)")
        ->capture_default_str();
    app.add_flag("--plan", f.show_plan, "print the memory plan (predicted peak of each stage) and exit");
    app.add_flag("--dry-run", f.dry_run,
                 "print the images the run would make, one JSON line each (settings, seed, noise and the PNG text "
                 "they would carry), and exit: reads the model's model.json, loads no weights, writes nothing");
    app.add_flag("--verbose", f.verbose,
                 "after the run, print predicted vs measured peak memory per stage and load times");
    app.add_option("--threads", f.threads,
                   "CPU threads (0: one per CPU this process may use: its affinity mask and its cgroup's CPU quota)")
        ->capture_default_str();
    // Text add-ons (issue 19): clip skip and textual-inversion embeddings.
    app.add_option("--clip-skip", f.job.settings.clip_skip,
                   "text encoder layers to skip, A1111's numbering: 1 = none, 2 = the last one (the prompt only; "
                   "the negative prompt uses every layer, as diffusers)")
        ->capture_default_str();
    app.add_option("--embedding", f.embeddings,
                   "a textual-inversion embedding (.safetensors, .pt, .bin); its trigger word is the file name without "
                   "extension (diffusers' learned_embeds: its token); repeatable");
    app.add_option("--embeddings-dir", f.embeddings_dir,
                   "load every embedding file in this folder (A1111's embeddings folder)");
    // Decoders and VAE weights at run time (docs/community-models.md "TAESD and a standalone VAE").
    app.add_option("--vae-decoder", f.vae_decoder,
                   "taesd:FILE: decode with TAESD (taesd_decoder.pth / .safetensors, or a diffusers AutoencoderTiny "
                   "folder) instead of the model's VAE: much faster, slightly less detail");
    app.add_option(
        "--preview", f.preview,
        "every N sampler steps, write a TAESD preview of each image to OUTDIR/previews (its path on stderr)");
    app.add_option("--preview-decoder", f.preview_decoder,
                   "taesd:FILE for --preview (default: the --vae-decoder TAESD)");
    app.add_option("--vae", f.vae,
                   "a standalone VAE (.safetensors / .ckpt, e.g. vae-ft-mse-840000-ema-pruned) replacing the model's "
                   "VAE decoder weights");
    app.add_flag("--tokenize", f.tokenize, "print each prompt's 77 token ids as a JSON array and exit");
    app.add_flag("--quiet,-q", f.quiet, "no progress on stderr");
    app.add_flag("--version", f.version, "print the version and the LibTorch it was built with, and exit");
    // LoRA: merged into the text encoder and UNet at load (docs/community-models.md "LoRA").
    app.add_option("--lora", f.loras,
                   "merge a LoRA .safetensors: FILE[:WEIGHT] (repeatable, in order; weight 1 by default)");
    app.add_option("--lora-dir", job.lora_dir,
                   "folder where a prompt's <lora:NAME:WEIGHT> tag finds NAME.safetensors (or in its subfolders, or "
                   "the file whose A1111 alias, ss_output_name, is NAME)");
    // SDXL's size conditioning (docs/export.md "SDXL").
    app.add_option("--original-size", f.original_size,
                   "SDXL: the size the picture is said to come from, WIDTHxHEIGHT (default: the image size)");
    app.add_option("--crop-coords", f.crop_coords,
                   "SDXL: the crop's top-left corner, TOP,LEFT in pixels (default: 0,0)");
    app.add_option("--target-size", f.target_size, "SDXL: the target size, WIDTHxHEIGHT (default: the image size)");
}

// --from-file - runs as its lines arrive (sd::run_txt2img_stream); --n_iter repeats
// the whole list and --tokenize prints it, so those read stdin to its end first.
bool streams_stdin(const Flags& f) { return f.from_file == "-" && !f.tokenize && !f.dry_run && f.job.n_iter == 1; }

// The prompts of --prompt or --from-file into the job.
void read_prompts(const CLI::App& app, Flags& f) {
    sd::Txt2ImgJob& job = f.job;
    const bool have_prompt = app.count("--prompt") > 0;
    if (have_prompt && !f.from_file.empty()) throw sd::Error("give either --prompt or --from-file, not both");
    if (!f.from_png.empty() && !f.from_file.empty()) throw sd::Error("give either --from-png or --from-file, not both");
    if (streams_stdin(f)) {
        // A stand-in line, so that the options are checked before the first line arrives.
        job.prompts.emplace_back();
        job.from_file = true;
    } else if (!f.from_file.empty()) {
        job.prompts = sd::read_prompt_file(f.from_file);
        job.from_file = true;
    } else if (have_prompt) {
        sd::check_prompt_text(f.prompt, "--prompt");
        sd::PromptLine line;
        line.prompt = f.prompt;
        job.prompts.push_back(line);
    } else if (!f.from_png.empty()) {
        job.prompts.emplace_back();  // each PNG's own prompt replaces it
    } else {
        throw sd::Error("no prompt given (use --prompt \"...\" or --from-file FILE)");
    }
    sd::check_prompt_text(job.negative_prompt, "--negative-prompt");
}

// --tokenize: the model's tokenizer and window, or without --model CLIP's own
// files with SD 1.x's window (ModelConfig's defaults).
void print_token_ids(const CLI::App& app, const Flags& f) {
    std::vector<std::string> texts;
    // Only the A1111 syntax reads <lora:...> (and other extra-network) tags; plain hands the whole text to the
    // tokenizer.
    for (const auto& p : f.job.prompts)
        texts.push_back(f.job.settings.prompt_weights ? sd::strip_network_tags(p.prompt) : p.prompt);
    sd::ModelConfig cfg;
    if (app.count("--model")) {
        cfg = sd::load_model_config(f.model_dir);  // resolved (resolve_model_flag)
    } else {
        cfg.vocab_path = std::string(SD_DEFAULT_CLIP_DIR) + "/vocab.json";
        cfg.merges_path = std::string(SD_DEFAULT_CLIP_DIR) + "/merges.txt";
    }
    print_tokens(sd::ClipTokenizer::load(cfg.vocab_path, cfg.merges_path), texts, cfg);
}

// plain: what CompVis's script encodes, the text as it is in one window cut at 77 tokens.
void set_prompt_syntax(sd::GenerateSettings& settings, const std::string& syntax) {
    if (syntax != "a1111" && syntax != "plain")
        throw sd::Error("--prompt-syntax must be a1111 or plain, got \"" + syntax + "\"");
    settings.long_prompts = settings.prompt_weights = syntax == "a1111";
}

// The run's settings from the flags, checked before any model loads.
void settle_job(const CLI::App& app, Flags& f) {
    sd::Txt2ImgJob& job = f.job;
    // The web UI's names become ours ("DPM++ 2M Karras" names the schedule too).
    const sd::SamplerName named =
        sd::settle_sampler_names(f.plms ? sd::default_sampler() : f.sampler,
                                 app.count("--schedule") ? job.settings.schedule : "", job.settings.schedule);
    job.settings.sampler = named.sampler;
    job.settings.schedule = named.schedule;
    sd::check_beta_parameter("--beta-alpha", job.settings.beta_alpha);
    sd::check_beta_parameter("--beta-beta", job.settings.beta_beta);
    sd::check_brownian_tree(job.settings.noise.brownian_tree);
    if (!f.manifest.empty()) sd::check_manifest_path(f.manifest, f.outdir);
    if (f.seed == "-1") {
        // Shards run in separate processes and a resumed run is a new one: each would draw its own
        // seed, and the images would not add up to one run. One fixed seed for the whole set is needed.
        const char* set = !f.shard.empty()      ? "--shard"
                          : f.job.skip_existing ? "--skip-existing"
                          : !f.manifest.empty() && sd::manifest_has_records(f.manifest)
                              ? "a --manifest that holds lines"
                              : nullptr;
        if (set)
            throw sd::Error(std::string("--seed -1 draws a new seed in every process, which breaks ") + set +
                            " (the runs must make one set): give a fixed --seed");
        // A random seed, recorded like any other (JSON line, PNG text, and here).
        std::random_device rd;
        job.seed = (static_cast<uint64_t>(rd()) << 32) | rd();
        if (!f.quiet) std::cerr << "sd-txt2img: seed " << job.seed << std::endl;
    } else {
        job.seed = sd::parse_seed("--seed", f.seed);
    }
    check_numeric_flags(app, job, f.batch_size, f.threads);
    if (f.seed_mode == "compvis")
        job.seed_mode = sd::SeedMode::compvis;
    else if (f.seed_mode == "per-image")
        job.seed_mode = sd::SeedMode::per_image;
    else
        throw sd::Error("--seed-mode must be compvis or per-image, got \"" + f.seed_mode + "\"");
    if (!f.shard.empty()) job.shard = sd::parse_shard(f.shard);
    job.outdir = f.outdir;
    job.save_latents = f.save_latents;
    job.save_noise = f.save_noise;
    job.settings.noise.rng = sd::parse_rng(f.rng);
    if (!f.subseed.empty()) job.settings.noise.subseed = sd::parse_seed("--subseed", f.subseed);
    if (!f.seed_resize_from.empty()) sd::parse_seed_resize_from(f.seed_resize_from, job.settings.noise);
    sd::check_noise_settings(job.settings.noise);
    for (const auto& l : f.loras) job.loras.push_back(sd::parse_lora_flag(l));
    if (!f.original_size.empty()) {
        const auto v = sd::parse_whole_pair("--original-size", f.original_size, 'x', 1);
        job.settings.original_width = v.first;
        job.settings.original_height = v.second;
    }
    if (!f.crop_coords.empty()) {
        const auto v = sd::parse_whole_pair("--crop-coords", f.crop_coords, ',', 0);
        job.settings.crop_top = v.first;
        job.settings.crop_left = v.second;
    }
    if (!f.target_size.empty()) {
        const auto v = sd::parse_whole_pair("--target-size", f.target_size, 'x', 1);
        job.settings.target_width = v.first;
        job.settings.target_height = v.second;
    }
    if (!f.hires_size.empty()) {
        const auto v = sd::parse_whole_pair("--hires-size", f.hires_size, 'x', 1);
        job.settings.hires.width = static_cast<int>(v.first);
        job.settings.hires.height = static_cast<int>(v.second);
    }
    sd::check_job(job);
}

// The settings a printed plan is made for: the job's, with every LoRA the run merges
// (--lora and the prompts' tags) counted as if merged at once.
sd::GenerateSettings planned_settings(const sd::Txt2ImgJob& job) {
    sd::GenerateSettings s = job.settings;
    s.loras = sd::check_job_loras(job);
    return s;
}

sd::PipelineOptions pipeline_options(const CLI::App& app, const Flags& f) {
    sd::PipelineOptions o;
    o.model_dir = f.model_dir;
    o.attention = f.attention;
    o.threads = f.threads;
    o.device = f.device;
    o.precision = f.precision;
    o.weights = f.weights;
    o.measure_stages = f.verbose;
    if (!f.max_memory.empty()) o.max_memory = sd::parse_size(f.max_memory);
    o.sequential = parse_switch("--sequential-load", f.sequential_load);
    o.prepack = parse_switch("--prepack", f.prepack);
    o.winograd = parse_switch("--winograd", f.winograd);
    o.vae_tile = parse_tiling(f.vae_tiling);
    if (app.count("--batch-size")) o.batch_size = f.batch_size;
    o.embeddings = f.embeddings;
    o.embeddings_dir = f.embeddings_dir;
    o.vae_decoder = f.vae_decoder;
    o.preview_decoder = f.preview_decoder;
    o.preview_every = f.preview;
    o.vae = f.vae;
    o.record_noise = !f.save_noise.empty();
    return o;
}

// Unset sizes: the size the model was trained at (a 64x64 demo model, SD 1.x 512);
// unset scale: the one its export recorded (the demo model's, models/demo/README.md).
void use_model_defaults(const CLI::App& app, const sd::ModelConfig& config,
                        const std::vector<sd::EmbeddingInfo>& embeddings, Flags& f) {
    sd::Txt2ImgJob& job = f.job;
    if (const int native = config.image_size; native > 0) {
        if (!app.count("--H")) job.settings.height = native;
        if (!app.count("--W")) job.settings.width = native;
    }
    // Starting from a picture: its own size (grown by --outpaint), as img2img.py and diffusers do.
    if (job.settings.init.active() && (!app.count("--H") || !app.count("--W"))) {
        const auto [w, h] = sd::init_canvas_size(job.settings.init, config.size_multiple);
        if (!app.count("--W")) job.settings.width = w;
        if (!app.count("--H")) job.settings.height = h;
    }
    if (config.guidance_scale > 0 && !app.count("--scale")) job.settings.scale = config.guidance_scale;
    // The model's recorded sampler recipe (model.json default_*): its steps and
    // schedule belong to its sampler, so they apply only when --sampler does too.
    const sd::ModelConfig& c = config;
    if (!c.default_sampler.empty() && !app.count("--sampler") && !f.plms) {
        job.settings.sampler = c.default_sampler;
        if (c.default_steps > 0 && !app.count("--steps")) job.settings.steps = c.default_steps;
        if (!c.default_schedule.empty() && !app.count("--schedule")) job.settings.schedule = c.default_schedule;
    }
    // Starting from a picture without --sampler: CompVis img2img.py's DDIM, as PLMS cannot start from one.
    // The hires fix's second pass starts from a picture too: the same for both passes.
    if ((job.settings.init.active() || job.settings.hires.active()) && !app.count("--sampler") && !f.plms &&
        job.settings.sampler == "plms")
        job.settings.sampler = "ddim";
    job.model_name = f.model_display_name.empty() ? model_name(config, f.model_dir) : f.model_display_name;
    job.model_hash = config.source_sha256.substr(0, 10);  // A1111's short hash of the checkpoint
    job.embeddings = embeddings;                          // for the PNG text's "TI hashes"
}

sd::ModelCacheOptions model_cache_options(const Flags& f) {
    sd::ModelCacheOptions o;
    o.cache_dir = f.model_cache;
    o.export_args = f.export_args;
    if (!f.quiet) o.note = [](const std::string& text) { std::cerr << "sd-txt2img: " << text << std::endl; };
    return o;
}

// --model FILE: the folder to load, exported into the cache on first use.
void resolve_model_flag(const CLI::App& app, Flags& f) {
    if (!app.count("--model")) {
        if (!f.export_args.empty()) throw sd::Error("--export-arg needs --model with a checkpoint");
        return;
    }
    const sd::ResolvedModel r = sd::resolve_model(f.model_dir, model_cache_options(f));
    if (r.name.empty() && !f.export_args.empty())
        throw sd::Error("--export-arg applies to a checkpoint's export; " + f.model_dir + " is a model folder already");
    f.model_dir = r.dir;
    f.model_display_name = r.name;
}

// --model-cache-list (one line per entry on stdout) and --model-cache-clear.
int manage_model_cache(const Flags& f) {
    const std::string dir = f.model_cache.empty() ? sd::default_model_cache_dir() : f.model_cache;
    if (f.model_cache_list) {
        for (const auto& e : sd::list_model_cache(dir)) {
            std::string line = e.path + "\t" + std::to_string((e.bytes + (1 << 20) - 1) >> 20) + " MiB\t" +
                               e.source_sha256.substr(0, 10) + "\t" + e.source_name;
            for (const auto& s : e.sources) line += "\t" + s;
            print_data_line(line);
        }
    }
    if (f.model_cache_clear) {
        const auto c = sd::clear_model_cache(dir);
        std::cerr << "sd-txt2img: model cache " << dir << ": removed " << c.entries << " entr"
                  << (c.entries == 1 ? "y" : "ies") << " and " << c.partial << " interrupted export"
                  << (c.partial == 1 ? "" : "s") << " (" << ((c.bytes + (1 << 20) - 1) >> 20) << " MiB)";
        if (c.busy) std::cerr << "; " << c.busy << " being exported by another process left alone";
        std::cerr << std::endl;
    }
    return 0;
}

// Every --from-png file read and its prompt checked, before the model loads.
// A field the tool cannot honour refuses the PNG, or under --from-png-lenient is named in one warning.
void read_recorded_images(Flags& f) {
    for (const auto& path : f.from_png) {
        f.recorded.push_back(sd::read_recorded_image(path));
        const std::string skipped = sd::check_honoured(f.recorded.back(), path, f.from_png_lenient);
        if (!skipped.empty())
            std::cerr << "sd-txt2img: warning: " << path
                      << ": remaking it without what this tool cannot honour: " << skipped << std::endl;
    }
}

// A PNG made from a picture (img2img, inpainting) is remade from the same
// picture, which it does not hold: --init-img (and --mask) must give it. A file
// whose SHA-256 differs from the recorded one gives a warning: a picture the
// user edited since is a thing to remake on purpose.
void use_recorded_picture(const CLI::App& app, const std::string& path, const sd::RecordedImage& rec,
                          sd::InitImage& init) {
    auto given = [&](const char* flag) { return app.count(flag) > 0; };
    if (!rec.strength || rec.hires()) return;  // a hires fix's strength is its second pass's
    if (!given("--init-img"))
        throw sd::Error(path + ": this image was made from a picture (img2img" +
                        (rec.mask_hash.empty() ? "" : ", inpainted") +
                        "), which a PNG does not hold: give it with --init-img FILE" +
                        (rec.mask_hash.empty() ? "" : " and its mask with --mask FILE"));
    if (!rec.mask_hash.empty() && !given("--mask"))
        throw sd::Error(path + ": this image was inpainted: give its mask with --mask FILE as well as --init-img");
    if (!given("--strength")) init.strength = *rec.strength;
    if (rec.mask_blur && !given("--mask-blur")) init.mask_blur = *rec.mask_blur;
    if (rec.invert_mask && !given("--invert-mask")) init.invert_mask = true;
    if (rec.outpaint && !given("--outpaint")) init.outpaint = *rec.outpaint;
    if (rec.resize_mode && !given("--resize-mode")) init.resize_mode = *rec.resize_mode;
    if (rec.masked_content && !given("--masked-content")) init.masked_content = *rec.masked_content;
}

// A hires-fixed PNG is remade with its hires settings, except those the flags give.
void use_recorded_hires(const CLI::App& app, const sd::RecordedImage& rec, sd::HiresFix& h) {
    auto given = [&](const char* flag) { return app.count(flag) > 0; };
    if (!rec.hires() || given("--hires-scale") || given("--hires-size")) return;
    h.scale = rec.hires_scale.value_or(0);
    h.width = rec.hires_width.value_or(0);
    h.height = rec.hires_height.value_or(0);
    if (!given("--hires-steps")) h.steps = rec.hires_steps.value_or(0);
    if (rec.strength && !given("--hires-strength")) h.strength = *rec.strength;
    if (rec.hires_upscaler && !given("--hires-upscaler")) h.upscaler = *rec.hires_upscaler;
}

// The warning above, once per PNG (before the model loads).
void warn_changed_pictures(const std::string& path, const sd::RecordedImage& rec, const sd::InitImage& init) {
    auto compare = [&](const std::string& file, const std::string& flag, const std::string& recorded) {
        if (recorded.empty() || sd::file_sha256(file, flag) == recorded) return;
        std::cerr << "sd-txt2img: warning: " << path << " was made from another picture than " << flag << " " << file
                  << " (its SHA-256 differs): the remake will differ" << std::endl;
    };
    compare(init.path, "--init-img", rec.init_hash);
    if (!init.mask.empty()) compare(init.mask, "--mask", rec.mask_hash);
}

// The job that remakes the image a PNG records: its settings, except those the flags give.
sd::Txt2ImgJob job_from_png(const CLI::App& app, const Flags& f, const std::string& path,
                            const sd::RecordedImage& rec) {
    // (a flag another part of issue 35 adds may not be there yet: then it was not given)
    auto given = [&](const char* flag) {
        const CLI::Option* o = app.get_option_no_throw(flag);
        return o != nullptr && o->count() > 0;
    };
    sd::Txt2ImgJob job = f.job;
    sd::PromptLine line;
    line.prompt = given("--prompt") ? f.prompt : rec.prompt;
    job.prompts = {line};
    job.from_file = false;
    if (!given("--n_iter")) job.n_iter = 1;
    if (!given("--negative-prompt")) job.negative_prompt = rec.negative_prompt;
    if (rec.steps && !given("--steps")) job.settings.steps = *rec.steps;
    if (rec.sampler && !given("--sampler") && !f.plms) job.settings.sampler = *rec.sampler;
    if (!given("--schedule")) job.settings.schedule = rec.schedule.value_or("default");
    if (rec.scale && !given("--scale")) job.settings.scale = *rec.scale;
    if (rec.width && !given("--W")) job.settings.width = *rec.width;
    if (rec.height && !given("--H")) job.settings.height = *rec.height;
    if (!given("--clip-skip")) job.settings.clip_skip = rec.clip_skip.value_or(1);
    // SDXL's size conditioning: recorded only where it was not the image's own size.
    if (rec.original_size && !given("--original-size"))
        std::tie(job.settings.original_width, job.settings.original_height) = *rec.original_size;
    if (rec.crop_coords && !given("--crop-coords"))
        std::tie(job.settings.crop_top, job.settings.crop_left) = *rec.crop_coords;
    if (rec.target_size && !given("--target-size"))
        std::tie(job.settings.target_width, job.settings.target_height) = *rec.target_size;
    if (!given("--prompt-syntax")) set_prompt_syntax(job.settings, rec.prompt_syntax.value_or("a1111"));
    // The web UI and stable-diffusion.cpp give image i of a batch its own generator seeded seed + i: per-image.
    const bool own_text = rec.writer == sd::TextWriter::this_tool;
    if ((rec.seed_mode || !own_text) && !given("--seed-mode"))
        job.seed_mode =
            rec.seed_mode.value_or("per-image") == "per-image" ? sd::SeedMode::per_image : sd::SeedMode::compvis;
    sd::NoiseSettings& noise = job.settings.noise;
    if (!given("--rng")) noise.rng = rec.rng;
    if (!given("--ensd")) noise.ensd = rec.ensd;
    if (!given("--subseed")) noise.subseed = rec.subseed;
    if (!given("--subseed-strength")) noise.subseed_strength = rec.subseed_strength;
    if (!given("--seed-resize-from")) {
        noise.seed_resize_from_w = rec.seed_resize_from_w;
        noise.seed_resize_from_h = rec.seed_resize_from_h;
    }
    if (!given("--brownian-tree")) noise.brownian_tree = rec.brownian_tree;
    if (!given("--eta")) noise.eta = rec.eta;
    const uint64_t seed = given("--seed") ? job.seed : rec.seed.value_or(job.seed);
    if (job.seed_mode == sd::SeedMode::per_image) {
        // Image i of a per-image run is seeded seed + i: keep its index, and so its text.
        job.first_index = rec.index.value_or(0);
        job.seed = seed - static_cast<uint64_t>(job.first_index);
        if (!given("--n_samples")) job.n_samples = 1;
    } else {
        // compvis: the image is one slice of its batch's noise, drawn from the run's seed.
        if (rec.batch_number.value_or(0) > 0)
            throw sd::Error(path + ": this image is from batch " + std::to_string(*rec.batch_number) +
                            " of a compvis run, whose noise depends on every batch before it; only a first batch's "
                            "images can be remade alone (--seed-mode per-image makes every image remakable)");
        job.seed = seed;
        if (!given("--n_samples")) {
            job.n_samples = rec.batch_size.value_or(1);
            if (job.n_samples > sd::kMaxReplayBatch)
                throw sd::Error(path + ": this image is one of a compvis batch of " + std::to_string(job.n_samples) +
                                " images, which would all be made again to remake it; batches over " +
                                std::to_string(sd::kMaxReplayBatch) + " are refused");
        }
        job.keep_position = rec.batch_position.value_or(0);
        if (*job.keep_position >= job.n_samples)
            throw sd::Error(path + ": batch position " + std::to_string(*job.keep_position) +
                            " is not within --n_samples " + std::to_string(job.n_samples));
    }
    use_recorded_picture(app, path, rec, job.settings.init);
    use_recorded_hires(app, rec, job.settings.hires);
    return job;
}

// A file that changed since the image was made gives another image: refused,
// or under --ignore-hash-mismatch a warning.
void hash_mismatch(const Flags& f, const std::string& png, const std::string& file, const std::string& recorded,
                   const std::string& now) {
    const std::string m =
        png + " records " + file + " with hash " + sd::text_excerpt(recorded) + ", but the file's hash is now " + now;
    if (!f.ignore_hash_mismatch)
        throw sd::Error(m + ": the remake would differ (--ignore-hash-mismatch remakes it anyway)");
    // A warning, not a note: shown with --quiet too, which silences progress.
    std::cerr << "sd-txt2img: warning: " << m << "; remaking it with the file as it is" << std::endl;
}

// Before the model loads: each PNG's job is whole (its prompt's tags, its
// LoRA files) and the LoRA files are those the PNG's "Lora hashes" recorded.
void check_png_jobs(const CLI::App& app, const Flags& f) {
    for (size_t i = 0; i < f.from_png.size(); ++i) {
        const std::string& path = f.from_png[i];
        const sd::RecordedImage& rec = f.recorded[i];
        std::vector<sd::LoraUse> loras;
        try {
            const sd::Txt2ImgJob job = job_from_png(app, f, path, rec);
            warn_changed_pictures(path, rec, job.settings.init);
            loras = sd::check_job_loras(job);
        } catch (const sd::Error& e) {
            const std::string what = e.what();
            throw sd::Error(what.rfind(path + ": ", 0) == 0 ? what : path + ": " + what);
        }
        for (const auto& l : loras)
            for (const auto& h : rec.loras)
                if (h.name == l.name && h.hash != l.hash) hash_mismatch(f, path, "the LoRA " + l.path, h.hash, l.hash);
        // A plain-syntax prompt carries no tags: its LoRAs come from --lora, and one left out changes the image.
        for (const auto& h : rec.loras)
            if (std::none_of(loras.begin(), loras.end(), [&](const sd::LoraUse& l) { return l.name == h.name; }))
                throw sd::Error(path + " was made with the LoRA \"" + sd::text_excerpt(h.name) +
                                "\" (its Lora hashes), which this remake does not load: give it with --lora");
    }
}

// After the model loads: what the PNG says about the model and its embeddings,
// and its settings against the model (its own values named as the PNG's).
void check_png_against_model(const CLI::App& app, const sd::Pipeline& pipeline, const Flags& f, const std::string& path,
                             const sd::RecordedImage& rec, const sd::Txt2ImgJob& job) {
    if (!rec.model.empty() && rec.model != job.model_name && !f.quiet)
        std::cerr << "sd-txt2img: note: " << path << " was made with model " << sd::text_excerpt(rec.model)
                  << ", remaking it with " << job.model_name << std::endl;
    std::vector<std::string> missing;  // "TI hashes": an embedding not loaded changes the image
    for (const auto& h : rec.embeddings) {
        const auto e = std::find_if(job.embeddings.begin(), job.embeddings.end(),
                                    [&](const sd::EmbeddingInfo& x) { return x.trigger == h.name; });
        if (e == job.embeddings.end())
            missing.push_back(h.name);
        else if (e->hash != h.hash)
            hash_mismatch(f, path, "the embedding " + e->path, h.hash, e->hash);
    }
    if (!missing.empty() && !f.quiet) {
        std::string names;
        for (size_t k = 0; k < missing.size() && k < 3; ++k)
            names += (k ? ", \"" : "\"") + sd::text_excerpt(missing[k]) + "\"";
        if (missing.size() > 3) names += " and " + std::to_string(missing.size() - 3) + " more";
        std::cerr << "sd-txt2img: note: " << path << " was made with the embedding" << (missing.size() > 1 ? "s " : " ")
                  << names << (missing.size() > 1 ? ", which are" : ", which is")
                  << " not loaded (--embedding or --embeddings-dir): the remake will differ" << std::endl;
    }
    if (rec.clip_skip && !app.count("--clip-skip"))
        sd::check_clip_skip(path + ": \"Clip skip\"", *rec.clip_skip, pipeline.config().text_layers_used);
    try {
        pipeline.check(job.settings);
    } catch (const sd::Error& e) {
        throw sd::Error(path + ": " + e.what());
    }
}

// --dry-run: each job's images as JSON lines, with the defaults of the model's
// model.json; checks that need its weights (Pipeline::check) are not made.
int dry_run(const CLI::App& app, Flags& f) {
    use_model_defaults(app, sd::load_model_config(f.model_dir), {}, f);
    std::vector<sd::Txt2ImgJob> jobs;
    if (f.from_png.empty()) jobs.push_back(f.job);
    for (size_t i = 0; i < f.from_png.size(); ++i) jobs.push_back(job_from_png(app, f, f.from_png[i], f.recorded[i]));
    for (const auto& job : jobs)
        for (const auto& line : sd::dry_run_records(job)) print_data_line(line);
    return 0;
}

// The run itself: images to stdout as they are written, progress and notes to stderr.
int generate(sd::Pipeline& pipeline, const Flags& f, const sd::Txt2ImgJob& job, sd::ProgressDisplay& progress,
             int& written) {
    sd::Txt2ImgEvents events;
    // --manifest: opened for appending, so shards' and resumed runs' lines add up.
    std::ofstream manifest;
    std::string model_hash;
    if (!f.manifest.empty()) {
        manifest.open(f.manifest, std::ios::app | std::ios::binary);
        if (!manifest) throw sd::Error("--manifest: cannot open " + f.manifest + " for appending");
        model_hash = sd::model_folder_hash(f.model_dir);
    }
    events.image_written = [&](const sd::ImageRecord& r) {
        progress.clear();
        ++written;  // the image is on disk whatever happens to its line
        if (manifest.is_open()) {
            manifest << sd::manifest_record_json(r, model_hash,
                                                 std::to_string(job.shard.k) + "/" + std::to_string(job.shard.n))
                     << '\n';
            manifest.flush();
            if (!manifest) throw sd::RunFailure("cannot write to --manifest " + f.manifest);
        }
        print_data_line(f.json ? sd::image_record_json(r) : r.path);
    };
    events.grid_written = [&](const std::string& path, const std::string& parameters, int images) {
        progress.clear();
        print_data_line(f.json ? sd::grid_record_json(path, parameters, images) : path);
    };
    events.progress = [&](const sd::ProgressInfo& p) { progress.update(p); };
    events.note = [&](const std::string& text) {
        if (f.quiet) return;
        progress.clear();
        std::cerr << "sd-txt2img: " << text << std::endl;
    };
    events.warning = [&](const std::string& text) {
        progress.clear();
        std::cerr << "sd-txt2img: warning: " << text << std::endl;
    };
    events.stop_requested = [] { return g_stop != 0; };
    // Previews were asked for, so their paths are shown even with --quiet; stdout stays the images'.
    if (f.preview > 0)
        events.preview_written = [&](const std::string& path) {
            progress.clear();
            std::cerr << "sd-txt2img: preview: " << path << std::endl;
        };
    g_bar_on_stderr = progress.mode() == sd::ProgressDisplay::Mode::bar;
    install_stop_handlers();

    std::optional<sd::PromptReader> stream;
    if (streams_stdin(f)) stream.emplace("-");
    const auto result =
        stream ? sd::run_txt2img_stream(pipeline, job, *stream, events) : sd::run_txt2img(pipeline, job, events);
    progress.clear();
    if (f.verbose)
        std::cerr << sd::measurement_report(pipeline.plan(planned_settings(job), job.n_samples), pipeline.measured(),
                                            pipeline.timings(), pipeline.compute().device != "cpu");
    if (!result.interrupted) return 0;
    std::cerr << "sd-txt2img: interrupted: " << written << " of " << result.planned << " images written"
              << (job.skip_existing || job.seed_mode == sd::SeedMode::per_image
                      ? "; run again with --skip-existing to finish"
                      : "")
              << std::endl;
    return kExitInterrupted;
}

}  // namespace

int main(int argc, char** argv) {
    sd::use_passive_openmp();
    sd::use_openblas_kernels_for_this_cpu();
    CLI::App app{"sd-txt2img: Stable Diffusion text to image on a modest machine"};
    // A flag given twice takes its last value, as shell users expect when appending to a command.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    Flags f;
    add_flags(app, f);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return fail(1, e.what());
    }

    sd::ProgressDisplay progress(sd::ProgressDisplay::detect(f.quiet));
    int written = 0;
    try {
        if (f.version) {
            print_data_line(std::string(sd::kVersionName) + " (LibTorch " + SD_TORCH_VERSION + ")");
            return 0;
        }
        if (f.model_cache_list || f.model_cache_clear) return manage_model_cache(f);
        read_prompts(app, f);
        read_recorded_images(f);
        set_prompt_syntax(f.job.settings, f.prompt_syntax);
        if (f.tokenize) {
            resolve_model_flag(app, f);
            print_token_ids(app, f);
            return 0;
        }
        settle_job(app, f);  // option conflicts are reported before the model loads
        check_png_jobs(app, f);
        resolve_model_flag(app, f);  // after every other check: a first use exports (minutes)
        if (f.dry_run) return dry_run(app, f);
        const sd::PipelineOptions options = pipeline_options(app, f);
        if (options.max_memory > 0)
            if (const std::string w = sd::max_memory_over_cgroup(options.max_memory); !w.empty())
                std::cerr << "sd-txt2img: warning: " << w << std::endl;
        const auto pipeline = sd::load_pipeline(options);
        use_model_defaults(app, pipeline->config(), pipeline->embeddings(), f);
        // The compute precision changes the picture: recorded when not fp32 ("Precision: bf16").
        if (pipeline->compute().precision != "fp32") f.job.precision = pipeline->compute().precision;
        if (!f.quiet && !pipeline->compute().note.empty())
            std::cerr << "sd-txt2img: note: " << pipeline->compute().note << std::endl;
        if (f.show_plan) {
            pipeline->check(f.job.settings);
            std::string plan_text = pipeline->plan(planned_settings(f.job), f.job.n_samples).describe();
            if (!plan_text.empty() && plan_text.back() == '\n') plan_text.pop_back();
            print_data_line(plan_text);
            return 0;
        }
        if (f.from_png.empty()) return generate(*pipeline, f, f.job, progress, written);
        std::vector<sd::Txt2ImgJob> jobs;  // every PNG read and checked before the first one is made
        for (size_t i = 0; i < f.from_png.size(); ++i) {
            jobs.push_back(job_from_png(app, f, f.from_png[i], f.recorded[i]));
            check_png_against_model(app, *pipeline, f, f.from_png[i], f.recorded[i], jobs.back());
        }
        for (const auto& job : jobs)
            if (const int code = generate(*pipeline, f, job, progress, written); code != 0) return code;
        return 0;
    } catch (const sd::Error& e) {
        progress.clear();
        return fail(1, e.what());
    } catch (const std::exception& e) {
        progress.clear();
        const int code = fail(2, e.what());
        if (written > 0)
            std::cerr << "sd-txt2img: " << written << (written == 1 ? " image was" : " images were")
                      << " written before the failure and " << (written == 1 ? "is" : "are") << " whole\n";
        return code;
    }
}
