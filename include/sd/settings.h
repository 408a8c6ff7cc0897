// What a run asks of the pipeline: the options fixed when it loads
// (PipelineOptions), the settings of each batch (GenerateSettings, with the
// LoRAs it merges), and where and how it computes (ComputeChoice).
// No LibTorch here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sd/sampler_catalog.h"

namespace sd {

struct PipelineOptions {
    std::string model_dir;
    std::string attention = "auto";  // auto | fused | full | per-head | chunked[:N]
    // Convolution weights in oneDNN's layout from load on (fp32 on the CPU;
    // stage_loader.h prepack_convolutions). Off: the file's dense layout.
    // Unset: on unless the memory budget needs the room (the planner decides).
    std::optional<bool> prepack;
    // The 3x3 convolutions of the UNet's first two levels, of a TAESD and of the VAE by
    // Winograd (with prepack, fp32, AVX2 or AVX-512; bf16 without AMX: the UNet's and the
    // VAE's larger ones): unset: the UNet's when memory allows (the VAE's and bf16's hold
    // no weights: on unless false).
    std::optional<bool> winograd;
    int threads = 0;                 // 0: one per usable CPU
    double max_memory = 0;           // bytes; 0: what the machine has available
    std::optional<bool> sequential;  // unset: the planner decides
    std::optional<int> batch_size;   // images per UNet pass; unset: the planner decides
    std::optional<int> vae_tile;     // latent tile edge for the VAE, 0: whole image; unset: the planner decides
    std::string device = "auto";     // auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    std::string precision = "auto";  // UNet and VAE compute: auto (cuda fp16, cpu fp32) | fp32 | fp16 | bf16
    std::string weights = "auto";    // UNet and VAE weights held as: auto (the compute dtype) | fp32 | fp16
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
    bool record_noise = false;  // keep each batch's noise draws in BatchOutput::noise (--save-noise)
};

// A textual-inversion embedding the pipeline loaded: the word that calls it up
// in a prompt, and A1111's short hash of its file (PNG text "TI hashes").
struct EmbeddingInfo {
    std::string trigger, hash;
    std::string path;  // the file it was read from (--from-png names it when its hash differs)
};

// One LoRA merged into the text encoder and UNet at load (--lora FILE[:W], or a
// prompt's <lora:NAME:W> / <lora:NAME:TE:UNET> tag found in --lora-dir).
struct LoraUse {
    std::string path;
    std::string name;  // the file's name without .safetensors (the tag's NAME)
    double text_weight = 1, unet_weight = 1;
    bool from_tag = false;  // named in the prompt (else by --lora)
    std::string where;      // "--lora" or "FILE:LINE" / "--prompt", for messages
    std::string hash;       // A1111's short hash (PNG text), filled by the run
    bool operator==(const LoraUse& o) const {
        return path == o.path && text_weight == o.text_weight && unet_weight == o.unet_weight;
    }
};

// Starting from a picture (--init-img; issue 33): img2img, and with a mask
// (or --outpaint) inpainting. The pipeline reads and prepares the files
// (src/image/init_pixels.h) for each batch.
struct InitImage {
    std::string path;                         // PNG, JPEG or BMP; empty: text to image
    std::string mask;                         // white (255) is repainted, black kept; empty: img2img
    double strength = 0.75;                   // 0 < S <= 1: how much of the schedule runs (A1111's denoising strength)
    int mask_blur = 0;                        // A1111's Gaussian blur radius of the mask, in pixels
    bool invert_mask = false;                 // repaint the black part instead
    std::string outpaint;                     // "LEFT,TOP,RIGHT,BOTTOM" pixels added and inpainted; empty: none
    std::string resize_mode = "just";         // just | crop | fill: a picture of another size than --W x --H
    std::string masked_content = "original";  // fill | original | latent-noise | latent-nothing
    std::string image_hash, mask_hash;        // SHA-256 of the files (PNG text), filled by the run
    // For library callers, instead of a picture: img2img from these latents
    // (already times the VAE's scale factor), [1 or n, C, H / f, W / f] as
    // BatchOutput::latents holds them; no encode, no posterior draw. The CLI never sets them.
    std::vector<float> latents;
    std::vector<int64_t> latent_shape;
    bool active() const { return !path.empty(); }
    bool from_latents() const { return !latents.empty(); }
    bool operator==(const InitImage& o) const {
        return path == o.path && mask == o.mask && strength == o.strength && mask_blur == o.mask_blur &&
               invert_mask == o.invert_mask && outpaint == o.outpaint && resize_mode == o.resize_mode &&
               masked_content == o.masked_content && latents == o.latents && latent_shape == o.latent_shape;
    }
};

// A1111's hires fix (issue 33): a first pass at the settings' size, an
// upscale, then an img2img pass at the new size with the same prompt, seed and
// sampler (src/engine/hires_pass.h says how; docs/img2img.md).
struct HiresFix {
    double scale = 0;                 // --hires-scale F: int(W * F) x int(H * F), rounded down to the model's multiple
    int width = 0, height = 0;        // --hires-size WxH instead (stretched to it); 0: from scale
    int steps = 0;                    // the second pass's --steps; 0: the first pass's (A1111's)
    double strength = 0.7;            // the second pass's strength (A1111's "Denoising strength", default 0.7)
    std::string upscaler = "latent";  // latent (bilinear) | latent-nearest | lanczos (pixels, then encoded again)
    bool active() const { return scale > 0 || width > 0 || height > 0; }
    // The second pass's size for a first pass of w x h, sides rounded down to `multiple`.
    std::pair<int, int> size(int w, int h, int multiple) const {
        if (width > 0 || height > 0) return {width, height};
        const int m = multiple > 0 ? multiple : 1;
        return {static_cast<int>(w * scale) / m * m, static_cast<int>(h * scale) / m * m};
    }
    bool operator==(const HiresFix& o) const {
        return scale == o.scale && width == o.width && height == o.height && steps == o.steps &&
               strength == o.strength && upscaler == o.upscaler;
    }
};

// Where the noise comes from (issue 35): the web UI's choices. The defaults
// are the references' (one CPU generator, no variation).
struct NoiseSettings {
    std::string rng = "cpu";          // cpu: LibTorch's CPU generator | nv: the web UI's GPU (Philox) generator
    int64_t ensd = 0;                 // eta noise seed delta (the web UI's ENSD)
    std::optional<uint64_t> subseed;  // variation seed; unset: none
    double subseed_strength = 0;      // 0 < F <= 1 with a subseed: how far toward its noise
    int seed_resize_from_w = 0;       // "Seed resize from" WxH; 0: off
    int seed_resize_from_h = 0;
    std::string brownian_tree = "a1111";  // SDE samplers' tree: a1111 (one per image) | kdiffusion (one per batch)
    std::optional<double> eta;            // ancestral/SDE samplers' eta; unset: the sampler's own default
    bool operator==(const NoiseSettings& o) const {
        return rng == o.rng && ensd == o.ensd && subseed == o.subseed && subseed_strength == o.subseed_strength &&
               seed_resize_from_w == o.seed_resize_from_w && seed_resize_from_h == o.seed_resize_from_h &&
               brownian_tree == o.brownian_tree && eta == o.eta;
    }
};

struct GenerateSettings {
    std::string sampler = default_sampler();  // sd/sampler_catalog.h
    std::string schedule =
        "default";  // a short name of sd/sampler_catalog.h (schedule_name): k-samplers' sigmas, PLMS/DDIM spacing
    int steps = 50;
    // --schedule beta's distribution (the web UI's "Beta schedule alpha/beta", its defaults).
    double beta_alpha = 0.6, beta_beta = 0.6;
    double scale = 7.5;
    int height = 512, width = 512;
    std::string negative_prompt;  // replaces the unconditional "" for every image
    bool long_prompts = true;     // more than 75 tokens: more 77-token windows (else truncated)
    bool prompt_weights = true;   // A1111 (text:1.3) / [text] / BREAK syntax (else plain text)
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
    InitImage init;
    NoiseSettings noise;  // issue 35; start noise and step draws: engine/web_noise.h (brownian_tree, eta: the samplers)
    HiresFix hires;       // batches never mix hires settings
};

// Where and how the UNet and VAE decoder compute, resolved from the options.
// The text encoder computes in fp32 on the same device, or in bf16 with --precision bf16
// (text_encoder_type()).
struct ComputeChoice {
    std::string device = "cpu";      // "cpu", "cuda:0", ...
    std::string precision = "fp32";  // fp32 | fp16 | bf16
    std::string weights = "fp32";    // fp32 | fp16 | bf16
    std::string note;                // a line for the user before the run (the CLI prints it), or empty
    std::string describe() const;    // "fp16 on cuda:0 (...), weights held in fp16 (text encoder: fp32)"
    // How the text encoders are held and computed: "bf16" with bf16 weights and compute (a bf16
    // run: on AMX a seventh of fp32's time, 1.3% from fp32's conditioning), else "fp32".
    std::string text_encoder_type() const { return precision == "bf16" && weights == "bf16" ? "bf16" : "fp32"; }
};

}  // namespace sd
