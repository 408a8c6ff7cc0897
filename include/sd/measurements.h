// What the pipeline measured while it ran: each stage's peak memory, the
// UNet and text encoder work, and load and compute times (--verbose).
#pragma once

namespace sd {

// Peak resident memory measured while each stage ran (bytes; 0 if it did not run).
struct StagePeaks {
    long long text = 0, unet = 0, vae = 0;
    long long encode = 0, encode_kept = 0;  // the VAE encoder (--init-img)
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
    double last_decode = 0;                   // the last batch's VAE (or TAESD) decode, without loading
    double encode_load = 0, last_encode = 0;  // the VAE encoder (--init-img): loading, the last batch's encode
};

}  // namespace sd
