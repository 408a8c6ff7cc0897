// Text to image: tokenizer -> text encoder -> sampler over the UNet with
// classifier-free guidance -> VAE decoder -> 8-bit images.
// This header has no LibTorch in it, so the CLI compiles quickly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sd/image.h"
#include "sd/memory_plan.h"
#include "sd/model_config.h"
#include "sd/samplers.h"

namespace sd {

struct PipelineOptions {
    std::string model_dir;
    std::string attention = "auto";      // auto | fused | full | per-head | chunked[:N]
    // Convolution weights in oneDNN's layout from load on (fp32 on the CPU;
    // stage_loader.h prepack_convolutions). Off: the file's dense layout.
    // Unset: on unless the memory budget needs the room (the planner decides).
    std::optional<bool> prepack;
    int threads = 0;                     // 0: one per core
    double max_memory = 0;               // bytes; 0: what the machine has available
    std::optional<bool> sequential;      // unset: the planner decides
    std::optional<int> batch_size;       // images per UNet pass; unset: the planner decides
    std::optional<int> vae_tile;         // latent tile edge for the VAE, 0: whole image; unset: the planner decides
    std::string device = "auto";         // auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    std::string precision = "auto";      // UNet and VAE compute: auto (cuda fp16, cpu fp32) | fp32 | fp16 | bf16
    std::string weights = "auto";        // UNet and VAE weights held as: auto (the compute dtype) | fp32 | fp16
    // Measure each stage's peak (resets the kernel's peak counter, so the
    // process-wide peak that /usr/bin/time reports then covers only the last stage).
    bool measure_stages = false;
    // Decoders and VAE weights chosen at run time (README "Fast images on a CPU").
    std::string vae_decoder;      // "": the model's VAE; "taesd:PATH": a TAESD decoder (file or AutoencoderTiny folder)
    std::string preview_decoder;  // "taesd:PATH" for previews; "": vae_decoder's TAESD, if it is one
    int preview_every = 0;        // a preview every N sampler steps (set_preview); 0: none
    std::string vae;              // a standalone VAE (.safetensors/.ckpt) replacing the model's VAE decoder weights
    // Textual inversion (issue 19): embedding files, and a folder of them (A1111's embeddings folder).
    std::vector<std::string> embeddings;
    std::string embeddings_dir;
};

// A textual-inversion embedding the pipeline loaded: the word that calls it up
// in a prompt, and A1111's short hash of its file (PNG text "TI hashes").
struct EmbeddingInfo {
    std::string trigger, hash;
    std::string path;  // the file it was read from (--from-png names it when its hash differs)
};

// Peak resident memory measured while each stage ran (bytes; 0 if it did not run).
struct StagePeaks {
    long long text = 0, unet = 0, vae = 0;
    // The most freed bytes the allocator kept for reuse during each stage (block_cache.h).
    long long text_kept = 0, unet_kept = 0, vae_kept = 0;
    // Large blocks the allocator handed out over the run, and how many of them were reused.
    long long large_blocks = 0, reused_blocks = 0;
    // The sampler's model evaluations and the UNet rows they ran (two per image
    // with guidance, one at --scale 1), and the 77-token windows the text
    // encoder ran (none for the negative prompt at --scale 1); --verbose reports them.
    long long unet_evaluations = 0, unet_rows = 0, text_rows = 0;
};

// Seconds spent loading each stage over all generate() calls (sequential
// loading reloads them for every batch), encoding the first batch's prompts
// (the text encoder's compute, without its loading), and the time from
// process start to the first sampler step of the first batch.
struct StageTimes {
    double text_load = 0, unet_load = 0, vae_load = 0;
    double first_text_encode = 0;
    double start_to_first_step = 0;
    double last_decode = 0;              // the last batch's VAE (or TAESD) decode, without loading
};

// One LoRA merged into the text encoder and UNet at load (--lora FILE[:W], or a
// prompt's <lora:NAME:W> / <lora:NAME:TE:UNET> tag found in --lora-dir).
struct LoraUse {
    std::string path;
    std::string name;                    // the file's name without .safetensors (the tag's NAME)
    double text_weight = 1, unet_weight = 1;
    bool from_tag = false;               // named in the prompt (else by --lora)
    std::string where;                   // "--lora" or "FILE:LINE" / "--prompt", for messages
    std::string hash;                    // A1111's short hash (PNG text), filled by the run
    bool operator==(const LoraUse& o) const {
        return path == o.path && text_weight == o.text_weight && unet_weight == o.unet_weight;
    }
};

struct GenerateSettings {
    std::string sampler = default_sampler();  // sd/samplers.h
    std::string schedule = "default";    // k-samplers: default | karras; PLMS/DDIM: default | leading | trailing
    int steps = 50;
    double scale = 7.5;
    int height = 512, width = 512;
    std::string negative_prompt;         // replaces the unconditional "" for every image
    bool long_prompts = true;            // more than 75 tokens: more 77-token windows (else truncated)
    bool prompt_weights = true;          // A1111 (text:1.3) / [text] / BREAK syntax (else plain text)
    // Text add-ons (issue 19): clip skip in AUTOMATIC1111's numbering: 1 = every
    // layer, N = the last N - 1 layers skipped (diffusers' clip_skip = N - 1), for the
    // prompt only (the negative prompt runs every layer, as diffusers does).
    int clip_skip = 1;
    // LoRA: merged at load, in this order; the pipeline reloads the text encoder
    // and UNet when a batch names another set (batches never mix sets).
    std::vector<LoraUse> loras;
    // SDXL's size conditioning (sgm's get_batch, diffusers' add_time_ids), in
    // pixels: 0 means the reference's default, the image's own size for the
    // original and the target size.
    int original_width = 0, original_height = 0, target_width = 0, target_height = 0;
    int crop_top = 0, crop_left = 0;
};

// Where and how the UNet and VAE decoder compute, resolved from the options.
// The text encoder always computes in fp32 on the same device.
struct ComputeChoice {
    std::string device = "cpu";          // "cpu", "cuda:0", ...
    std::string precision = "fp32";      // fp32 | fp16 | bf16
    std::string weights = "fp32";        // fp32 | fp16 | bf16
    std::string describe() const;        // "fp16 on cuda:0 (...), weights held in fp16 (text encoder: fp32)"
};

// Called after each sampler step: step (1-based) of total.
using ProgressFn = std::function<void(int step, int total)>;

// Called every PipelineOptions::preview_every steps with the batch's current
// images: its predicted final latents (the denoised x0) through the preview TAESD.
using PreviewFn = std::function<void(int step, int total, const std::vector<Image>& images)>;

struct BatchOutput {
    std::vector<Image> images;
    std::vector<float> latents;          // final latents of the batch, [n, C, h, w]
    std::vector<int64_t> latent_shape;
};

// Text to image over one exported model. An interface: its implementation is
// the LibTorch side (pipeline.cpp), which a program reaches through
// load_pipeline() (engine.h) so that it does not load LibTorch before it needs to.
class Pipeline {
public:
    virtual ~Pipeline() = default;

    virtual const ModelConfig& config() const = 0;
    virtual const ComputeChoice& compute() const = 0;

    // Throws sd::Error when the model cannot run these settings (size, steps, sampler).
    virtual void check(const GenerateSettings& s) const = 0;

    // The memory plan for a batch of `images` images with these settings.
    // Throws sd::Error when nothing fits the budget.
    virtual MemoryPlan plan(const GenerateSettings& s, int images) const = 0;

    // Peaks measured during the last generate().
    virtual const StagePeaks& measured() const = 0;
    virtual const StageTimes& timings() const = 0;

    // Seeds the run's generator; every batch then draws its start noise from it in turn.
    virtual void seed(uint64_t seed) = 0;

    // One batch: one image per prompt.
    virtual BatchOutput generate(const std::vector<std::string>& prompts, const GenerateSettings& s,
                                 const ProgressFn& progress = nullptr) = 0;

    // The textual-inversion embeddings loaded (PipelineOptions::embeddings).
    virtual std::vector<EmbeddingInfo> embeddings() const { return {}; }
    // Where previews go (PipelineOptions::preview_every); nullptr: none are made.
    virtual void set_preview(PreviewFn fn) = 0;
};

// The --verbose report (stderr lines): the plan, then predicted against
// measured peak of each stage, load times and the allocator's block reuse.
// On a GPU the prediction is of device memory, which host RSS does not see.
std::string measurement_report(const MemoryPlan& plan, const StagePeaks& measured, const StageTimes& times, bool on_gpu);

// Reads model.json, checks every stage's files from their headers and loads
// the tokenizer; the TorchScript stages load on first use. Throws sd::Error.
// Defined on the LibTorch side.
std::unique_ptr<Pipeline> make_pipeline(const PipelineOptions& options);

}  // namespace sd
