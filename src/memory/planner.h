// The memory planner: predicts the peak resident memory of each stage from
// the model's architecture and picks stage loading, attention chunking, UNet
// micro-batch and VAE tiling so that the run fits a budget (or says up front
// how much it would need). The model of memory is derived in docs/memory.md
// and checked against measurements in docs/benchmarks.md.
#pragma once
#include <optional>
#include <vector>

#include "io/lora_keys.h"
#include "sd/memory_plan.h"
#include "sd/model_config.h"

namespace sd {

// What the user fixed; unset fields are the planner's to choose.
struct MemoryRequest {
    int height = 512, width = 512;
    int images = 1;                             // images in the largest batch of the run
    bool guidance = true;                       // scale != 1: the UNet sees 2 rows per image
    double budget = 0;                          // bytes; 0: what the machine has available
    bool budget_from_cgroup = false;            // memory_budget.h: the memory cgroup set it
    std::optional<bool> sequential;             // --sequential-load on|off
    std::optional<AttentionSetting> attention;  // --attention, unless auto
    std::optional<int> unet_rows;               // rows per UNet pass (2 per image with guidance)
    std::optional<int> vae_tile;                // latent tile edge; 0 = no tiling
    bool half_weights = false;                  // --weights fp16: UNet and VAE weights held in fp16
    bool half_text = false;                     // --precision bf16: the text encoders held in bf16 too
    bool q8_weights = false;                    // --weights q8: UNet weights in 8-bit blocks (never chosen here)
    // --prepack; false where it cannot apply (not fp32 on a CPU), unset: on when it fits.
    // With q8_weights it is the VAE's alone (a q8 UNet is never prepacked).
    std::optional<bool> prepack;
    // --winograd; false where it cannot apply (no prepack, or no Winograd convolution
    // on this CPU), unset: on when it fits.
    std::optional<bool> winograd;
    std::optional<int> winograd_levels;  // a UNet already loaded holds these levels' slots
    // Floats a 3x3 weight's 9 add in Winograd form: 36 in oneDNN's F(4x4, 3x3) (AVX-512),
    // held beside the direct weight; 16 - 9 = 7 in the own F(2x2, 3x3) (AVX2), which
    // replaces it.
    double winograd_added_floats = 36;
    // LoRA: what merging makes while each stage loads (io/lora_keys.h; both text encoders in text_lora).
    LoraFootprint text_lora, unet_lora;
    bool encode = false;  // the batch runs the VAE encoder on a height x width picture
    // Scratch the UNet's and the VAE's layers keep from call to call while they are loaded:
    // bf16's Winograd convolutions (kernels/winograd_bf16.h), for the stage's largest layer (the
    // UNet's: conv_split_bytes() at most), and its 1x1 convolutions' sums (kernels/pointwise_bf16.h).
    double unet_scratch_bytes = 0, vae_scratch_bytes = 0;
};

// The most weight bytes (counted at 4 a value) one convolution call takes in every
// plan (MemoryPlan::conv_split): layers with more run in slices of output channels.
double conv_split_bytes();

// Architecture constants of the memory model, read from model.json.
struct MemoryModel {
    double text_weights = 0, unet_weights = 0, vae_weights = 0;  // bytes (sizes of the .pt files)
    double vae_encoder_weights = 0;                              // 0: the export has no encoder
    bool half_file = false;                                      // the .pt files hold fp16 or bf16 weights
    bool q8_file = false;  // a --dtype q8_0 export: the UNet file holds 8-bit blocks (the rest fp32)
    int latent_channels = 4, downsample = 8;
    int model_channels = 320;
    double unet_skip_floats = 0;  // floats per latent pixel held in the UNet's skip list, per row
    double unet_largest_conv_bytes = 0;
    // Per UNet level, its width (channel_mult x model_channels) and the bytes its 3x3
    // convolutions' weights take in Winograd form at 36 floats for 9 (F(4x4, 3x3);
    // MemoryRequest::winograd_added_floats scales it), for the levels a plan may give them
    // (kWinogradLevels).
    std::vector<int> unet_level_channels;
    std::vector<double> unet_winograd_bytes;
    int attn_level = 0;  // finest UNet level with attention (-1: none)
    int attn_heads = 8;
    int attn_channels = 320;       // q/k/v width at that level
    bool fused_attention = false;  // the modules have the fused operator (model.json)
    int vae_ch = 128;
    int vae_mid_channels = 512;
    int text_ctx = 77, text_width = 768, text_heads = 12;
    // A TAESD decodes in place of the VAE (--vae-decoder taesd:): its channel
    // count, 0 for the model's VAE. vae_weights are then its weights.
    int taesd_channels = 0;
};

MemoryModel memory_model(const ModelConfig& config);

// The VAE stage becomes a TAESD of `channels` channels holding `weight_bytes`.
void set_taesd_stage(MemoryModel& m, int channels, double weight_bytes);

// Predicts one configuration.
MemoryPlan predict(const MemoryModel& m, const MemoryRequest& r, double base, const MemoryPlan& choice);

// Chooses the fastest configuration that fits r.budget; throws sd::Error with
// the smallest budget that would work when none fits.
MemoryPlan plan_memory(const MemoryModel& m, const MemoryRequest& r, double base);

}  // namespace sd
