// The model's TorchScript stages as the run holds them: loaded on first use,
// released when the memory plan says so, held in the weight type and on the
// device chosen once (resolve_compute), with the batch's LoRAs merged into
// the text encoder and UNet and --vae's tensors into the VAE decoder.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "engine/stage_loader.h"
#include "io/lora_keys.h"
#include "sd/pipeline.h"

namespace sd {

// Resolves --device, --precision and --weights, or throws sd::Error naming
// what cannot run here.
ComputeChoice resolve_compute(const PipelineOptions& o);

// A --dtype q8_0 export (model.json dtype "q8_0") holds its UNet in 8-bit blocks: --weights
// auto keeps them as they are (fp32 compute); any other weight type, or --precision bf16,
// expands them at load (engine/q8_weights.h expand_q8).
void match_weight_file(ComputeChoice& c, const PipelineOptions& o, const ModelConfig& config);

class LoadedStages {
public:
    LoadedStages(const PipelineOptions& options, const ModelConfig& config, const ComputeChoice& compute,
                 StageTimes& times);

    const ModelConfig& config() const { return config_; }
    const c10::Device& device() const { return device_; }
    at::ScalarType held_type() const { return held_type_; }
    at::ScalarType compute_type() const { return compute_type_; }
    at::ScalarType text_type() const { return text_type_; }
    // --weights q8: the UNet's layers held as 8-bit blocks (engine/q8_weights.h), the VAE in fp32.
    bool q8_unet() const { return q8_unet_; }

    // Each stage, loaded now if it is not (the load's seconds go to StageTimes).
    torch::jit::Module& text_encoder();
    torch::jit::Module& text_encoder_2();  // SDXL's second (OpenCLIP bigG)
    torch::jit::Module& unet();
    torch::jit::Module& vae_decoder();
    torch::jit::Module& vae_encoder();  // img2img; config().vae_encoder_path must be set
    bool unet_loaded() const { return unet_.has_value(); }

    void release_text_encoders();
    void release_unet();
    void release_vae_decoder();
    void release_vae_encoder();

    // Stage inputs go to the device in the compute dtype; outputs come back as
    // fp32 on the CPU, where the sampler and its generator live (so a seed
    // gives the same start noise on every device). On a CPU in fp32 both are no-ops.
    at::Tensor to_device(const at::Tensor& t) const;
    static at::Tensor to_host(const at::Tensor& t) { return t.to(at::kCPU, at::kFloat); }

    // --prepack for the stages loaded next (the plan's choice), whether it can
    // apply to the UNet (or VAE) at all, and whether the UNet (or VAE decoder) that
    // stays loaded was packed (later plans must count it as it is).
    void set_prepack(bool on) { prepack_ = on; }
    bool prepack_applies_to_unet() const { return prepack_applies(config_.unet_path); }
    bool prepack_applies_to_vae() const { return prepack_applies(config_.vae_decoder_path); }
    bool unet_packed() const { return unet_packed_; }
    bool vae_decoder_loaded() const { return vae_decoder_.has_value(); }
    bool vae_packed() const { return vae_packed_; }
    // The plan's Winograd choice for the UNet loaded next (with --prepack), and
    // how many levels' Winograd slots the loaded UNet holds.
    void set_winograd(const WinogradChoice& w) { winograd_ = w; }
    // --winograd for the VAE encoder and decoder loaded next (with --prepack): their 3x3
    // convolutions by the own route with weights made per call (no memory held).
    void set_vae_winograd(bool on) { vae_winograd_ = on; }
    // The latent size a bf16 UNet or VAE loads for: its layers that sd::conv3x3 runs by
    // Winograd at that size keep plain weights (prepack_convolutions).
    void set_bf16_winograd_latent(int64_t h, int64_t w) { bf16_latent_h_ = h, bf16_latent_w_ = w; }
    bool winograd_applies_to_unet() const;
    int unet_winograd_levels() const { return unet_winograd_levels_; }

    // --vae: a standalone VAE's decoder tensors, read and checked now.
    void set_vae_override(const std::string& path);

    // LoRA: the batch's set, merged as the text encoder and UNet load; another
    // set than the loaded one releases both.
    void use_loras(const std::vector<LoraUse>& loras);
    // A LoRA file's modules, read once, mapped onto this model's weight files and checked against them.
    const LoraFile& lora_file(const LoraUse& use) const;
    // What merging these LoRAs makes in the text encoders and in the UNet (the planner's MemoryRequest).
    std::pair<LoraFootprint, LoraFootprint> lora_bytes(const std::vector<LoraUse>& loras) const;

private:
    using Slot = std::optional<torch::jit::Module>;
    torch::jit::Module& load(Slot& slot, const std::string& path, double* seconds);
    void release(Slot& slot);
    at::ScalarType weight_type(const std::string& path) const;
    bool prepack_applies(const std::string& path) const;

    const ModelConfig& config_;
    std::string model_dir_;
    StageTimes& times_;
    c10::Device device_ = c10::kCPU;
    at::ScalarType compute_type_ = at::kFloat, held_type_ = at::kFloat;  // UNet and VAE
    at::ScalarType text_type_ = at::kFloat;                              // the text encoders, held and computed
    Slot text_encoder_, text_encoder_2_, unet_, vae_decoder_, vae_encoder_;
    bool prepack_ = false, unet_packed_ = false, vae_packed_ = false;
    int unet_winograd_levels_ = 0;
    WinogradChoice winograd_;
    bool vae_winograd_ = false;
    int64_t bf16_latent_h_ = 0, bf16_latent_w_ = 0;
    bool q8_unet_ = false;
    std::map<std::string, at::Tensor> vae_override_;
    std::vector<LoraUse> merged_loras_;
    mutable std::map<std::string, LoraFile> lora_files_;
    mutable std::optional<LoraTargets> lora_targets_;
};

}  // namespace sd
