#include "engine/loaded_stages.h"

#include <torch/cuda.h>

#include "engine/lora_merge.h"
#include "engine/q8_weights.h"
#include "engine/runtime.h"
#include "engine/stage_loader.h"
#include "engine/vae_override.h"
#include "io/fs_util.h"
#include "io/weight_file.h"
#include "kernels/linear_kernel.h"
#include "kernels/winograd_bf16.h"
#include "sd/error.h"

namespace sd {

namespace {

at::ScalarType dtype_named(const std::string& name) {
    if (name == "fp16") return at::kHalf;
    if (name == "bf16") return at::kBFloat16;
    return at::kFloat;
}

std::string cuda_device(const std::string& flag, const std::string& dev) {
    const std::string index = dev.size() > 5 ? dev.substr(5) : "0";
    if (index.empty() || index.size() > 3 || index.find_first_not_of("0123456789") != std::string::npos)
        throw Error("unknown --device '" + flag + "' (auto, cpu, cuda or cuda:N)");
    if (!torch::cuda::is_available())
        throw Error("--device " + flag +
                    ": no CUDA GPU is available (this LibTorch is built for CPU only, "
                    "or no GPU is visible); use --device cpu");
    if (std::stoi(index) >= static_cast<int>(torch::cuda::device_count()))
        throw Error("--device " + flag + ": there are only " + std::to_string(torch::cuda::device_count()) +
                    " CUDA devices");
    return "cuda:" + std::to_string(std::stoi(index));
}

}  // namespace

ComputeChoice resolve_compute(const PipelineOptions& o) {
    ComputeChoice c;
    const std::string dev = o.device == "auto" ? (torch::cuda::is_available() ? "cuda" : "cpu") : o.device;
    if (dev == "cuda" || dev.rfind("cuda:", 0) == 0)
        c.device = cuda_device(o.device, dev);
    else if (dev != "cpu")
        throw Error("unknown --device '" + o.device + "' (auto, cpu, cuda or cuda:N)");
    const bool cpu = c.device == "cpu";
    c.precision = o.precision == "auto" ? (cpu ? "fp32" : "fp16") : o.precision;
    if (c.precision != "fp32" && c.precision != "fp16" && c.precision != "bf16")
        throw Error("unknown --precision '" + o.precision + "' (auto, fp32, fp16 or bf16)");
    if (cpu && c.precision == "fp16")
        throw Error(
            "--precision fp16 is not available on CPU: LibTorch 1.13 has no fp16 convolution kernels on CPU; "
            "use --precision fp32 (--weights fp16 still halves the weights)");
    // Without bf16 instructions LibTorch and oneDNN emulate bf16: 18-50x slower than fp32 (measured).
    if (cpu && c.precision == "bf16" && !kernels::cpu_has_bf16())
        throw Error(
            "--precision bf16 needs a CPU with bf16 instructions (avx512_bf16 or AMX), which this one lacks "
            "(or DNNL_MAX_CPU_ISA hides); use --precision fp32 (--weights fp16 still halves the weights)");
    // Without AMX, bf16 products run on avx512_bf16's dot product, which on the Intel CPU measured gives
    // under half the FLOP of fp32 FMA (bench/isa_peak.cpp): a step ran 1.39-1.58x slower than fp32
    // (docs/benchmarks.md). Still worth it for half the weights' memory, but the user should know. On
    // AMD's Zen 4 it gives twice fp32's FLOPs, and a step takes 0.62x fp32's: no note there.
    if (cpu && c.precision == "bf16" && !kernels::cpu_has_amx() && !kernels::cpu_bf16_dot_outruns_fp32())
        c.note =
            "--precision bf16 on a CPU without AMX can run slower than fp32 (1.4-1.6x slower where measured); it "
            "still halves the weights' memory";
    if (o.weights != "auto" && o.weights != "fp32" && o.weights != "fp16" && o.weights != "q8")
        throw Error("unknown --weights '" + o.weights + "' (auto, fp32, fp16 or q8)");
    c.weights = o.weights == "auto" ? c.precision : o.weights;
    // q8 layers expand their blocks to fp32 weights as they run: fp32 compute only.
    if (c.weights == "q8" && c.precision != "fp32")
        throw Error(
            "--weights q8 computes in fp32 (each layer expands its 8-bit blocks to fp32 weights); it does not go "
            "with --precision " +
            c.precision);
    return c;
}

void match_weight_file(ComputeChoice& c, const PipelineOptions& o, const ModelConfig& config) {
    if (config.dtype == "q8_0" && o.weights == "auto" && c.precision == "fp32") c.weights = "q8";
    // A bf16 export runs in fp32 too (widened at load), but on AMX the user likely meant bf16.
    if (config.dtype == "bfloat16" && c.device == "cpu" && c.precision == "fp32" && c.note.empty() &&
        kernels::cpu_has_amx())
        c.note = "the model holds bf16 weights (--dtype bfloat16): --precision " + o.precision +
                 " widens them to fp32 at load; --precision bf16 maps them as they are, and runs faster here";
}

std::string ComputeChoice::describe() const {
    std::string s = precision + " on " + device;
    if (precision != "fp32") s += " (attention scores, softmax and norms in fp32)";
    return s + ", weights held in " + weights + " (text encoder: " + text_encoder_type() + ")";
}

LoadedStages::LoadedStages(const PipelineOptions& options, const ModelConfig& config, const ComputeChoice& compute,
                           StageTimes& times)
    : config_(config),
      model_dir_(options.model_dir),
      times_(times),
      device_(compute.device),
      compute_type_(dtype_named(compute.precision)),
      held_type_(dtype_named(compute.weights)),
      text_type_(dtype_named(compute.text_encoder_type())),
      q8_unet_(compute.weights == "q8") {}

torch::jit::Module& LoadedStages::text_encoder() {
    return load(text_encoder_, config_.text_encoder_path, &times_.text_load);
}
torch::jit::Module& LoadedStages::text_encoder_2() {
    return load(text_encoder_2_, config_.text_encoder_2_path, &times_.text_load);
}
torch::jit::Module& LoadedStages::unet() { return load(unet_, config_.unet_path, &times_.unet_load); }
torch::jit::Module& LoadedStages::vae_decoder() {
    return load(vae_decoder_, config_.vae_decoder_path, &times_.vae_load);
}

torch::jit::Module& LoadedStages::vae_encoder() {
    return load(vae_encoder_, config_.vae_encoder_path, &times_.encode_load);
}

void LoadedStages::release_text_encoders() {
    release(text_encoder_);
    release(text_encoder_2_);
}
void LoadedStages::release_unet() { release(unet_); }
void LoadedStages::release_vae_decoder() { release(vae_decoder_); }
void LoadedStages::release_vae_encoder() { release(vae_encoder_); }

at::Tensor LoadedStages::to_device(const at::Tensor& t) const {
    return t.is_floating_point() ? t.to(device_, compute_type_) : t.to(device_);
}

// The text encoders run alone, before the UNet: fp32, or bf16 in a bf16 run (ComputeChoice::text_encoder_type).
at::ScalarType LoadedStages::weight_type(const std::string& path) const {
    return path == config_.text_encoder_path || path == config_.text_encoder_2_path ? text_type_ : held_type_;
}

// oneDNN's layout is for fp32, or bf16 compute on bf16 weights, on a CPU only.
bool LoadedStages::prepack_applies(const std::string& path) const {
    if (q8_unet_ && path == config_.unet_path) return false;  // its convolutions expand 8-bit weights per call
    const bool fp32 = compute_type_ == at::kFloat && weight_type(path) == at::kFloat;
    const bool bf16 = compute_type_ == at::kBFloat16 && weight_type(path) == at::kBFloat16;
    return device_.is_cpu() && (fp32 || bf16);
}

// The blocked route (fp32) on a CPU where oneDNN has Winograd convolutions.
bool LoadedStages::winograd_applies_to_unet() const {
    return prepack_applies(config_.unet_path) && compute_type_ == at::kFloat &&
           weight_type(config_.unet_path) == at::kFloat && winograd_available();
}

torch::jit::Module& LoadedStages::load(Slot& slot, const std::string& path, double* seconds) {
    if (slot) return *slot;
    const double start = seconds_since_process_start();
    const bool vae = path == config_.vae_decoder_path && !vae_override_.empty();
    const std::string lora_stage = path == config_.unet_path             ? "unet"
                                   : path == config_.text_encoder_path   ? "text_encoder"
                                   : path == config_.text_encoder_2_path ? "text_encoder_2"
                                                                         : "";
    StageEdit edit = nullptr;
    const bool keep_8bit = q8_unet_ && path == config_.unet_path;
    if (!lora_stage.empty() && !merged_loras_.empty()) {
        std::vector<LoraMerge> merges;
        for (const auto& use : merged_loras_) merges.push_back({lora_file(use), use.text_weight, use.unet_weight});
        // 8-bit layers are narrowed from the merged fp32 weights (below); the other types at once.
        const at::ScalarType held = keep_8bit ? at::kFloat : weight_type(path);
        edit = [lora_stage, merges, held](torch::jit::Module& m) { merge_loras(m, lora_stage, merges, held); };
    }
    if (keep_8bit || config_.dtype == "q8_0") {
        // A q8_0 export's 8-bit layers run as they are mapped, unless a LoRA is merged into them or
        // another type is held: then they are expanded to fp32 first (and narrowed again for q8).
        // 8-bit UNet weights from a float file: narrowed after any LoRA is merged, layer by layer.
        edit = [edit, path, keep_8bit](torch::jit::Module& m) {
            if (edit || !keep_8bit) expand_q8(m);
            if (edit) edit(m);
            if (keep_8bit) narrow_to_q8(m, path);
        };
    }
    slot = load_stage(path, weight_type(path), device_, vae ? &vae_override_ : nullptr, edit);
    if (prepack_ && prepack_applies(path)) {
        const bool unet = path == config_.unet_path;
        int winograd_layers = 0;
        // the ResNet blocks on blocked activations, then the other convolutions
        const bool vae_stage = path == config_.vae_decoder_path || path == config_.vae_encoder_path;
        prepack_blocked(*slot, unet ? winograd_ : WinogradChoice{{}, vae_stage && vae_winograd_}, &winograd_layers);
        prepack_convolutions(*slot, bf16_latent_h_, bf16_latent_w_);
        use_fused_rows(*slot);  // fp32's one-pass GEGLU gate
        if (&slot == &vae_decoder_) vae_packed_ = true;
        if (unet) {
            unet_packed_ = true;
            unet_winograd_levels_ = winograd_layers > 0 ? static_cast<int>(winograd_.levels.size()) : 0;
        }
    }
    *seconds += seconds_since_process_start() - start;
    return *slot;
}

void LoadedStages::release(Slot& slot) {
    if (&slot == &unet_) {
        unet_packed_ = false;
        unet_winograd_levels_ = 0;
    }
    if (&slot == &vae_decoder_) vae_packed_ = false;
    slot.reset();
    // bf16 Winograd's scratch, shared by the UNet's and the VAE's layers, goes with the UNet,
    // or with a VAE stage run without it.
    if (&slot == &unet_ || (!unet_ && (&slot == &vae_decoder_ || &slot == &vae_encoder_)))
        kernels::winograd_bf16_release();
    release_free_memory();
}

void LoadedStages::set_vae_override(const std::string& path) {
    // Read as inference tensors, so the stage (loaded inside the run's
    // InferenceMode) takes them as they are: one copy of the VAE, not two.
    c10::InferenceMode guard;
    vae_override_ = read_vae_override(path, weight_file_for(config_.vae_decoder_path));
}

void LoadedStages::use_loras(const std::vector<LoraUse>& loras) {
    if (loras == merged_loras_) return;
    release(text_encoder_);
    release(text_encoder_2_);
    release(unet_);
    merged_loras_ = loras;
}

const LoraFile& LoadedStages::lora_file(const LoraUse& use) const {
    if (auto it = lora_files_.find(use.path); it != lora_files_.end()) return it->second;
    if (!lora_targets_) {
        LoraTargets t;
        std::vector<std::pair<const std::string*, std::vector<WeightEntry>*>> stages = {
            {&config_.unet_path, &t.unet}, {&config_.text_encoder_path, &t.text_encoder}};
        if (config_.is_sdxl()) stages.emplace_back(&config_.text_encoder_2_path, &t.text_encoder_2);
        for (auto [path, index] : stages) {
            if (!file_exists(weight_file_for(*path)))
                throw Error("LoRA needs a model exported with .weights files; re-export " + model_dir_);
            *index = read_weight_index(weight_file_for(*path));
        }
        lora_targets_ = std::move(t);
    }
    try {
        return lora_files_.emplace(use.path, read_lora(use.path, *lora_targets_)).first->second;
    } catch (const Error& e) {
        if (use.where == "--lora" || use.where.empty()) throw;
        throw Error(use.where + ": " + e.what() + " (named by the prompt's <lora:" + use.name + "> tag)");
    }
}

std::pair<LoraFootprint, LoraFootprint> LoadedStages::lora_bytes(const std::vector<LoraUse>& loras) const {
    if (loras.empty()) return {};
    std::vector<const LoraFile*> files;
    for (const auto& use : loras) files.push_back(&lora_file(use));
    // The text encoders load one after the other but stay loaded together: their costs add up.
    const LoraFootprint t1 = lora_footprint(files, lora_targets_->text_encoder, "text_encoder"),
                        t2 = lora_footprint(files, lora_targets_->text_encoder_2, "text_encoder_2");
    const LoraFootprint text = {t1.touched + t2.touched, t1.largest + t2.largest,
                                std::max(t1.largest_param, t2.largest_param)};
    return {text, lora_footprint(files, lora_targets_->unet, "unet")};
}

}  // namespace sd
