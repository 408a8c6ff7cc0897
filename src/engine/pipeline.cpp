#include "sd/pipeline.h"

#include <chrono>
#include <functional>
#include <map>
#include <optional>

#include <torch/cuda.h>
#include <torch/script.h>

#include "engine/block_cache.h"
#include "engine/lora_merge.h"
#include "io/fs_util.h"
#include "io/weight_file.h"
#include "engine/conditioning.h"
#include "engine/sdxl_conditioning.h"
#include "engine/embeddings.h"
#include "io/embedding_file.h"
#include "sd/error.h"
#include "engine/stage_loader.h"
#include "engine/runtime.h"
#include "engine/samplers.h"
#include "engine/taesd.h"
#include "engine/vae_override.h"
#include "memory/planner.h"
#include "io/weight_file.h"
#include "sampling/schedule.h"
#include "sd/tokenizer.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

// The GPU budget when --max-memory is not given: this LibTorch has no CUDA
// headers to ask the driver, and 4 GiB is the smallest GPU SD users run on.
constexpr double kDefaultGpuBudget = 4.0 * (1 << 30);

at::ScalarType dtype_named(const std::string& name) {
    if (name == "fp16") return at::kHalf;
    if (name == "bf16") return at::kBFloat16;
    return at::kFloat;
}

// Resolves --device, --precision and --weights, or throws sd::Error naming
// what cannot run here.
ComputeChoice resolve_compute(const PipelineOptions& o) {
    ComputeChoice c;
    const bool have_cuda = torch::cuda::is_available();
    const std::string dev = o.device == "auto" ? (have_cuda ? "cuda" : "cpu") : o.device;
    if (dev == "cuda" || dev.rfind("cuda:", 0) == 0) {
        const std::string index = dev.size() > 5 ? dev.substr(5) : "0";
        if (index.empty() || index.size() > 3 || index.find_first_not_of("0123456789") != std::string::npos)
            throw Error("unknown --device '" + o.device + "' (auto, cpu, cuda or cuda:N)");
        if (!have_cuda)
            throw Error("--device " + o.device + ": no CUDA GPU is available (this LibTorch is built for CPU only, "
                        "or no GPU is visible); use --device cpu");
        if (std::stoi(index) >= static_cast<int>(torch::cuda::device_count()))
            throw Error("--device " + o.device + ": there are only " + std::to_string(torch::cuda::device_count()) +
                        " CUDA devices");
        c.device = "cuda:" + std::to_string(std::stoi(index));
    } else if (dev != "cpu") {
        throw Error("unknown --device '" + o.device + "' (auto, cpu, cuda or cuda:N)");
    }
    const bool cpu = c.device == "cpu";
    c.precision = o.precision == "auto" ? (cpu ? "fp32" : "fp16") : o.precision;
    if (c.precision != "fp32" && c.precision != "fp16" && c.precision != "bf16")
        throw Error("unknown --precision '" + o.precision + "' (auto, fp32, fp16 or bf16)");
    if (cpu && c.precision == "fp16")
        throw Error("--precision fp16 is not available on CPU: LibTorch 1.13 has no fp16 convolution kernels on CPU; "
                    "use --precision fp32 (--weights fp16 still halves the weights)");
    if (o.weights != "auto" && o.weights != "fp32" && o.weights != "fp16")
        throw Error("unknown --weights '" + o.weights + "' (auto, fp32 or fp16)");
    c.weights = o.weights == "auto" ? c.precision : o.weights;
    return c;
}

using DecodeFn = std::function<at::Tensor(const at::Tensor&)>;

// Decoder output [n, 3, H, W] in [-1, 1] to 8-bit images, as txt2img does it:
// clamp((x + 1) / 2, 0, 1) * 255, then truncation to uint8.
std::vector<Image> to_images(const at::Tensor& decoded) {
    const at::Tensor pixels =
        (255.0 * at::clamp((decoded + 1.0) / 2.0, 0.0, 1.0)).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
    const int64_t H = pixels.size(1), W = pixels.size(2);
    std::vector<Image> images;
    for (int64_t i = 0; i < pixels.size(0); ++i) {
        Image img;
        img.height = static_cast<int>(H);
        img.width = static_cast<int>(W);
        const uint8_t* p = pixels[i].data_ptr<uint8_t>();
        img.rgb.assign(p, p + H * W * 3);
        images.push_back(std::move(img));
    }
    return images;
}

// Decodes latents [1, C, h, w] in overlapping tiles of `tile` latent pixels and
// blends them with linear ramps across each overlap, so the peak is that of
// one tile. Each tile normalises over itself (GroupNorm), so tiles differ
// slightly at their edges; the ramps fade one into the next without a seam.
at::Tensor decode_tiled(const DecodeFn& decode_one, const at::Tensor& z, int tile, int factor) {
    const int64_t h = z.size(2), w = z.size(3);
    const int64_t overlap = std::max<int64_t>(2, tile / 4);
    auto starts = [&](int64_t size) {
        std::vector<int64_t> s;
        if (size <= tile) return std::vector<int64_t>{0};
        for (int64_t p = 0;; p += tile - overlap) {
            if (p + tile >= size) {
                s.push_back(size - tile);
                break;
            }
            s.push_back(p);
        }
        return s;
    };
    const auto ys = starts(h), xs = starts(w);
    const int64_t th = std::min<int64_t>(tile, h), tw = std::min<int64_t>(tile, w);
    at::Tensor out, weight;
    // A ramp over `overlap * factor` pixels on each side that meets another tile.
    auto ramp = [&](int64_t len, bool lo, bool hi) {
        const double n = static_cast<double>(overlap * factor);
        const auto i = at::arange(len, at::kFloat);
        auto r = at::ones({len});
        if (lo) r = at::minimum(r, (i + 0.5) / n);
        if (hi) r = at::minimum(r, (static_cast<double>(len - 1) - i + 0.5) / n);
        return r;
    };
    for (size_t yi = 0; yi < ys.size(); ++yi) {
        for (size_t xi = 0; xi < xs.size(); ++xi) {
            const int64_t y = ys[yi], x = xs[xi];
            auto piece = decode_one(z.slice(2, y, y + th).slice(3, x, x + tw).contiguous());
            if (!out.defined()) {
                out = at::zeros({1, piece.size(1), h * factor, w * factor});
                weight = at::zeros({1, 1, h * factor, w * factor});
            }
            auto wy = ramp(th * factor, yi > 0, yi + 1 < ys.size());
            auto wx = ramp(tw * factor, xi > 0, xi + 1 < xs.size());
            auto m = (wy.view({-1, 1}) * wx.view({1, -1})).view({1, 1, th * factor, tw * factor});
            auto o = out.slice(2, y * factor, (y + th) * factor).slice(3, x * factor, (x + tw) * factor);
            o.add_(piece * m);
            weight.slice(2, y * factor, (y + th) * factor).slice(3, x * factor, (x + tw) * factor).add_(m);
        }
    }
    return out / weight;
}

}  // namespace

std::string ComputeChoice::describe() const {
    std::string s = precision + " on " + device;
    if (precision != "fp32") s += " (attention scores, softmax and norms in fp32)";
    return s + ", weights held in " + weights + " (text encoder: fp32)";
}

// The LibTorch implementation of the Pipeline interface.
class TorchPipeline final : public Pipeline {
public:
    explicit TorchPipeline(const PipelineOptions& options);
    ~TorchPipeline() override;
    const ModelConfig& config() const override;
    const ComputeChoice& compute() const override;
    void check(const GenerateSettings& s) const override;
    MemoryPlan plan(const GenerateSettings& s, int images) const override;
    const StagePeaks& measured() const override;
    const StageTimes& timings() const override;
    void seed(uint64_t seed) override;
    BatchOutput generate(const std::vector<std::string>& prompts, const GenerateSettings& s,
                         const ProgressFn& progress) override;
    std::vector<EmbeddingInfo> embeddings() const override;
    void set_preview(PreviewFn fn) override;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

struct TorchPipeline::Impl {
    PipelineOptions options;
    ComputeChoice compute;
    c10::Device device = c10::kCPU;
    at::ScalarType compute_type = at::kFloat, held_type = at::kFloat;  // UNet and VAE
    ModelConfig config;
    MemoryModel memory;
    double base_rss = 0;
    std::optional<ClipTokenizer> tokenizer;
    std::optional<torch::jit::Module> text_encoder, text_encoder_2, unet, vae;  // text_encoder_2: SDXL
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
    StagePeaks peaks;
    StageTimes times;
    std::vector<Embedding> embeddings;  // textual inversion
    // LoRA: the set merged into the loaded text encoder and UNet, and every file read so far.
    std::vector<LoraUse> merged_loras;
    mutable std::map<std::string, LoraFile> lora_files;
    mutable std::optional<LoraTargets> lora_targets;

    // A LoRA file's modules, mapped onto this model's weight files and checked against them.
    const LoraFile& lora_file(const LoraUse& use) const {
        if (auto it = lora_files.find(use.path); it != lora_files.end()) return it->second;
        if (!lora_targets) {
            LoraTargets t;
            for (auto [path, index] : {std::pair{&config.unet_path, &t.unet}, std::pair{&config.text_encoder_path, &t.text_encoder}}) {
                if (!file_exists(weight_file_for(*path)))
                    throw Error("LoRA needs a model exported with .weights files; re-export " + options.model_dir);
                *index = read_weight_index(weight_file_for(*path));
            }
            lora_targets = std::move(t);
        }
        try {
            return lora_files.emplace(use.path, read_lora(use.path, *lora_targets)).first->second;
        } catch (const Error& e) {
            if (use.where == "--lora" || use.where.empty()) throw;
            throw Error(use.where + ": " + e.what() + " (named by the prompt's <lora:" + use.name + "> tag)");
        }
    }

    // Merges the batch's LoRAs into the text encoder and UNet as they load; a
    // batch with another set reloads both.
    void use_loras(const std::vector<LoraUse>& loras) {
        if (loras == merged_loras) return;
        release(text_encoder);
        release(text_encoder_2);
        release(unet);
        merged_loras = loras;
    }

    StageEdit lora_edit(const std::string& path) const {
        const std::string which = path == config.unet_path ? "unet" : path == config.text_encoder_path ? "text_encoder" : "";
        if (which.empty() || merged_loras.empty()) return nullptr;
        std::vector<LoraMerge> merges;
        for (const auto& use : merged_loras) merges.push_back({lora_file(use), use.text_weight, use.unet_weight});
        return [which, merges](torch::jit::Module& m) { merge_loras(m, which, merges); };
    }
    // Run-time decoders and VAE weights (PipelineOptions): a TAESD in place of
    // the VAE, the one previews use, and --vae's decoder tensors.
    std::optional<TaesdDecoder> taesd, preview_taesd;
    std::map<std::string, at::Tensor> vae_override;
    PreviewFn preview;

    // The text encoders always hold fp32 weights: they run alone, before the UNet.
    at::ScalarType weight_type(const std::string& path) const {
        return path == config.text_encoder_path || path == config.text_encoder_2_path ? at::kFloat : held_type;
    }
    // oneDNN's layout is for fp32 on a CPU only.
    bool prepack_applies(const std::string& path) const {
        return device.is_cpu() && compute_type == at::kFloat && weight_type(path) == at::kFloat;
    }
    // The plan's --prepack for the stages loaded next, and whether the UNet
    // that stays loaded was packed (later plans must count it as it is).
    bool prepack = false, unet_packed = false;

    // Stage inputs go to the device in the compute dtype; outputs come back as
    // fp32 on the CPU, where the sampler and its generator live (so a seed gives
    // the same start noise on every device). On CPU in fp32 these are no-ops.
    at::Tensor to_device(const at::Tensor& t) const {
        return t.is_floating_point() ? t.to(device, compute_type) : t.to(device);
    }
    static at::Tensor to_host(const at::Tensor& t) { return t.to(at::kCPU, at::kFloat); }

    torch::jit::Module& stage(std::optional<torch::jit::Module>& slot, const std::string& path, double* seconds) {
        if (!slot) {
            const double start = seconds_since_process_start();
            const bool vae_stage = path == config.vae_decoder_path && !vae_override.empty();
            slot = load_stage(path, weight_type(path), device, vae_stage ? &vae_override : nullptr,
                              lora_edit(path));
            if (prepack && prepack_applies(path)) {
                prepack_convolutions(*slot);
                if (path == config.unet_path) unet_packed = true;
            }
            *seconds += seconds_since_process_start() - start;
        }
        return *slot;
    }

    void release(std::optional<torch::jit::Module>& slot) {
        if (&slot == &unet) unet_packed = false;
        slot.reset();
        release_free_memory();
    }

    // Long prompts and weighting: conditioning.h. Clip skip for the prompts only (as diffusers).
    // SDXL: both encoders and the UNet's vector input (sdxl_conditioning.h).
    SdxlConditioning encode_text(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 const GenerateSettings& s) {
        if (config.is_sdxl()) return encode_sdxl(prompts, negatives, s);
        auto& te = stage(text_encoder, config.text_encoder_path, &times.text_load);
        check_text_encoder_features(te, config.text_encoder_path, s.clip_skip != 1, !embeddings.empty());
        const at::Tensor extra = embedding_table(embeddings, config.context_dim).to(device);
        auto encoder = [&](int64_t skip) -> TextEncodeFn {
            return [&, skip](const at::Tensor& ids) {
                peaks.text_rows += ids.size(0);
                return to_host(encode_ids(te, ids.to(device), skip, extra));
            };
        };
        const auto added = added_words(embeddings, token_table(te).size(0));
        auto [cond, uncond] = encode_conditioning(encoder(s.clip_skip - 1), encoder(0), *tokenizer, config, prompts,
                                                  negatives, {s.long_prompts, s.prompt_weights}, added);
        return {cond, uncond, {}, {}};
    }

    SdxlConditioning encode_sdxl(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives,
                                 const GenerateSettings& s) {
        auto& te1 = stage(text_encoder, config.text_encoder_path, &times.text_load);
        auto& te2 = stage(text_encoder_2, config.text_encoder_2_path, &times.text_load);
        auto encoders = [&](int64_t skip) {
            SdxlEncoders e;
            e.first = [&, skip](const at::Tensor& ids) {
                peaks.text_rows += ids.size(0);
                te1.setattr("clip_skip", skip);
                return to_host(te1.forward({ids.to(device)}).toTensor());
            };
            e.second = [&, skip](const at::Tensor& ids) {
                peaks.text_rows += ids.size(0);
                te2.setattr("clip_skip", skip);
                auto out = te2.run_method("forward_pooled", ids.to(device)).toTuple();
                return std::pair{to_host(out->elements()[0].toTensor()), to_host(out->elements()[1].toTensor())};
            };
            return e;
        };
        const auto& st = s;
        const SizeValues sizes = {st.original_height ? st.original_height : st.height,
                                  st.original_width ? st.original_width : st.width,
                                  st.crop_top,
                                  st.crop_left,
                                  st.target_height ? st.target_height : st.height,
                                  st.target_width ? st.target_width : st.width};
        return encode_sdxl_conditioning(encoders(s.clip_skip - 1), encoders(0), *tokenizer, config, prompts, negatives,
                                        {s.long_prompts, s.prompt_weights}, sizes);
    }

    // TAESD takes the UNet's latents as they are and gives [0, 1]; 2x - 1 makes
    // it a VAE's output. One image at a time, like the VAE.
    at::Tensor decode_taesd(const TaesdDecoder& t, const at::Tensor& latents) const {
        std::vector<at::Tensor> images;
        for (int64_t i = 0; i < latents.size(0); ++i)
            images.push_back(to_host(t.decode(to_device(latents.slice(0, i, i + 1)))) * 2.0 - 1.0);
        return at::cat(images);
    }

    // Decodes one image at a time (the VAE's activations grow with pixels).
    at::Tensor decode(const at::Tensor& latents, const MemoryPlan& plan) {
        if (taesd) return decode_taesd(*taesd, latents);
        auto& dec = stage(vae, config.vae_decoder_path, &times.vae_load);
        set_attention(dec, {plan.attention_mode, plan.attention_chunk});
        set_layer_memory(dec, plan.ff_chunk, plan.conv_split);
        const at::Tensor z = latents * (1.0 / config.scale_factor);
        const DecodeFn decode_one = [&](const at::Tensor& zi) { return to_host(dec.forward({to_device(zi)}).toTensor()); };
        std::vector<at::Tensor> images;
        for (int64_t i = 0; i < z.size(0); ++i) {
            auto zi = z.slice(0, i, i + 1);
            images.push_back(plan.vae_tile > 0 ? decode_tiled(decode_one, zi, plan.vae_tile, config.downsample_factor)
                                               : decode_one(zi));
        }
        return at::cat(images);
    }

    // --vae-decoder, --preview-decoder, --preview and --vae, checked and read
    // before anything runs (all of them are small but the VAE).
    void load_addons(const PipelineOptions& o) {
        if (o.preview_every < 0) throw Error("--preview takes a number of steps, at least 1 (0: no previews)");
        if (!o.vae_decoder.empty()) taesd = TaesdDecoder::load(taesd_path_of(o.vae_decoder, "--vae-decoder"));
        if (!o.preview_decoder.empty()) {
            preview_taesd = TaesdDecoder::load(taesd_path_of(o.preview_decoder, "--preview-decoder"));
        } else if (o.preview_every > 0) {
            if (!taesd)
                throw Error("--preview needs a TAESD decoder to draw its previews: give --preview-decoder taesd:FILE "
                            "(e.g. taesd_decoder.pth) or --vae-decoder taesd:FILE");
            preview_taesd = taesd;
        }
        if (!o.vae.empty()) {
            if (taesd)
                throw Error("--vae replaces the weights of the model's VAE, which --vae-decoder " + o.vae_decoder +
                            " does not use; give one of them");
            // Read as inference tensors, so the stage (loaded inside the run's
            // InferenceMode) takes them as they are: one copy of the VAE, not two.
            c10::InferenceMode guard;
            vae_override = read_vae_override(o.vae, weight_file_for(config.vae_decoder_path));
        }
        for (auto* t : {&taesd, &preview_taesd})
            if (*t) (*t)->to(device, compute_type);
    }

    // Previews of the current predicted images every preview_every steps.
    void maybe_preview(int step, int total, const at::Tensor& x, const at::Tensor& pred_x0) {
        const int every = options.preview_every;
        if (!preview || every <= 0 || !preview_taesd || (step + 1) % every != 0) return;
        const at::Tensor decoded = decode_taesd(*preview_taesd, pred_x0.defined() ? pred_x0 : x);
        preview(step + 1, total, to_images(decoded));
    }

    MemoryRequest request(const GenerateSettings& s, int images) const {
        MemoryRequest r;
        r.height = s.height;
        r.width = s.width;
        r.images = images;
        r.guidance = s.scale != 1.0;
        r.budget = options.max_memory > 0 ? options.max_memory
                   : device.is_cpu()      ? available_memory()
                                          : kDefaultGpuBudget;
        r.sequential = options.sequential;
        if (options.attention != "auto") r.attention = parse_attention(options.attention);
        if (options.batch_size) r.unet_rows = *options.batch_size * (r.guidance ? 2 : 1);
        if (options.vae_tile) r.vae_tile = *options.vae_tile;
        r.half_weights = held_type != at::kFloat;
        if (!prepack_applies(config.unet_path)) r.prepack = false;
        else if (unet) r.prepack = unet_packed;
        else r.prepack = options.prepack;
        if (!s.loras.empty()) {
            std::vector<const LoraFile*> files;
            for (const auto& use : s.loras) files.push_back(&lora_file(use));
            r.text_lora_bytes = lora_footprint(files, lora_targets->text_encoder, "text_encoder").total();
            r.unet_lora_bytes = lora_footprint(files, lora_targets->unet, "unet").total();
        }
        return r;
    }
};

TorchPipeline::TorchPipeline(const PipelineOptions& options) : impl_(std::make_unique<Impl>()) {
    impl_->options = options;
    if (options.attention != "auto") parse_attention(options.attention);  // reject bad names up front
    impl_->compute = resolve_compute(options);
    impl_->device = c10::Device(impl_->compute.device);
    impl_->compute_type = dtype_named(impl_->compute.precision);
    impl_->held_type = dtype_named(impl_->compute.weights);
    if (options.batch_size && *options.batch_size < 1) throw Error("--batch-size must be at least 1");
    if (options.vae_tile && *options.vae_tile < 0) throw Error("--vae-tiling takes auto, on, off or a tile size");
    impl_->config = load_model_config(options.model_dir);
    const bool full_vae = options.vae_decoder.empty();
    for (const auto* stage : {&impl_->config.text_encoder_path, &impl_->config.unet_path, &impl_->config.vae_decoder_path,
                              &impl_->config.text_encoder_2_path})
        if (!stage->empty() && (full_vae || stage != &impl_->config.vae_decoder_path)) check_stage_files(*stage);
    impl_->load_addons(options);
    impl_->memory = memory_model(impl_->config);
    if (impl_->taesd) set_taesd_stage(impl_->memory, impl_->taesd->channels(), impl_->taesd->weight_bytes());
    impl_->tokenizer = ClipTokenizer::load(impl_->config.vocab_path, impl_->config.merges_path);
    if (impl_->config.is_sdxl() && !(options.embeddings.empty() && options.embeddings_dir.empty()))
        throw Error("textual-inversion embeddings on SDXL models are not supported yet (only SD 1.x and 2.x ones); "
                    "run without --embedding and --embeddings-dir");
    impl_->embeddings = load_embeddings(embedding_files(options.embeddings, options.embeddings_dir),
                                        impl_->config.context_dim, impl_->config.context_length - 2);
    configure_runtime(options.threads);
    impl_->base_rss = static_cast<double>(current_rss_bytes());
}

TorchPipeline::~TorchPipeline() = default;

const ModelConfig& TorchPipeline::config() const { return impl_->config; }
const ComputeChoice& TorchPipeline::compute() const { return impl_->compute; }
const StagePeaks& TorchPipeline::measured() const {
    const auto c = block_cache_stats();
    impl_->peaks.large_blocks = static_cast<long long>(c.hits + c.misses);
    impl_->peaks.reused_blocks = static_cast<long long>(c.hits);
    return impl_->peaks;
}
const StageTimes& TorchPipeline::timings() const { return impl_->times; }
std::vector<EmbeddingInfo> TorchPipeline::embeddings() const {
    std::vector<EmbeddingInfo> out;
    for (const auto& e : impl_->embeddings) out.push_back({e.trigger, e.hash, e.path});
    return out;
}

void TorchPipeline::check(const GenerateSettings& s) const {
    const auto& c = impl_->config;
    check_sampler_settings(s.sampler, s.schedule, s.steps);
    parse_parameterization(c.parameterization);
    const int T = static_cast<int>(c.alphas_cumprod.size());
    if (s.steps < 1 || s.steps > T)
        throw Error("--steps must be between 1 and " + std::to_string(T) + ", the number of timesteps in this model's noise " +
                    "schedule (model.json alphas_cumprod), got " + std::to_string(s.steps));
    sampler_step_count(s.sampler, s.schedule, s.steps, T);  // rejects CompVis counts whose schedule runs past T-1
    check_clip_skip("--clip-skip", s.clip_skip, c.text_layers_used);
    for (auto [name, v] : {std::pair<const char*, int>{"--H", s.height}, {"--W", s.width}}) {
        if (v < c.size_multiple || v % c.size_multiple != 0)
            throw Error(std::string(name) + " " + std::to_string(v) + " is not a positive multiple of " +
                        std::to_string(c.size_multiple) + ", which this model needs");
    }
    const bool size_flags = s.original_width || s.original_height || s.target_width || s.target_height || s.crop_top ||
                            s.crop_left;
    if (size_flags && !c.is_sdxl())
        throw Error("--original-size, --crop-coords and --target-size are SDXL's size conditioning; this model is " +
                    (c.family == "sd1" ? std::string("SD 1.x") : std::string("SD 2.x")) + ", which has none");
    if (c.is_sdxl() && !s.loras.empty())
        throw Error("LoRA on SDXL models is not supported yet (only SD 1.x and 2.x LoRAs merge); run without --lora "
                    "and <lora:...> tags");
    for (const auto& lora : s.loras) impl_->lora_file(lora);  // read and matched before any stage loads
}

MemoryPlan TorchPipeline::plan(const GenerateSettings& s, int images) const {
    // On a GPU the budget is the device's memory, which the host RSS does not touch.
    MemoryPlan p = plan_memory(impl_->memory, impl_->request(s, images), impl_->device.is_cpu() ? impl_->base_rss : 0);
    p.compute = impl_->compute.describe();
    if (!impl_->device.is_cpu()) {  // GPU headroom is no host memory
        p.block_cache = 0;
        p.text.kept = p.unet.kept = p.vae.kept = 0;
    }
    return p;
}

void TorchPipeline::set_preview(PreviewFn fn) { impl_->preview = std::move(fn); }

void TorchPipeline::seed(uint64_t seed) { impl_->gen = at::make_generator<at::CPUGeneratorImpl>(seed); }

BatchOutput TorchPipeline::generate(const std::vector<std::string>& prompts, const GenerateSettings& s, const ProgressFn& progress) {
    check(s);
    if (prompts.empty()) throw Error("no prompts to generate");
    auto& im = *impl_;
    const auto& c = im.config;
    im.use_loras(s.loras);
    const MemoryPlan plan = this->plan(s, static_cast<int>(prompts.size()));
    set_block_cache_limit(static_cast<size_t>(plan.block_cache));
    im.prepack = plan.prepack;
    c10::InferenceMode guard;
    const int64_t n = static_cast<int64_t>(prompts.size());
    const int64_t h = s.height / c.downsample_factor, w = s.width / c.downsample_factor;
    im.peaks = {};
    const bool first_batch = im.times.start_to_first_step == 0;
    const bool measure = im.options.measure_stages;
    auto start_measure = [&] {
        if (measure) reset_peak_rss();
    };
    auto stage_peak = [&] { return measure ? peak_rss_bytes() : 0; };
    // Each stage frees the last one's kept blocks: they are of other sizes.
    auto end_stage = [&](long long& peak, long long& kept) {
        peak = stage_peak();
        kept = static_cast<long long>(block_cache_stats().peak_cached_bytes);
        drop_cached_blocks();
    };

    try {
        // Text: the unconditional embedding is the encoder's output for "" (not zeros).
        start_measure();
        const double text_start = seconds_since_process_start(), text_load_before = im.times.text_load;
        // Scale 1 is the cond alone: the negative prompt is not even encoded (diffusers' guidance_scale <= 1).
        const bool guided = s.scale != 1.0;
        auto [cond, uncond, cond_y, uncond_y] =
            im.encode_text(prompts, std::vector<std::string>(guided ? prompts.size() : 0, s.negative_prompt), s);
        if (first_batch)
            im.times.first_text_encode =
                seconds_since_process_start() - text_start - (im.times.text_load - text_load_before);
        if (plan.sequential) {
            im.release(im.text_encoder);
            im.release(im.text_encoder_2);
        }
        end_stage(im.peaks.text, im.peaks.text_kept);

        // Sampling, with the UNet run in passes of at most plan.unet_rows rows.
        start_measure();
        at::Tensor x = at::randn({n, c.latent_channels, h, w}, im.gen);
        auto& unet = im.stage(im.unet, c.unet_path, &im.times.unet_load);
        set_attention(unet, {plan.attention_mode, plan.attention_chunk});
        set_layer_memory(unet, plan.ff_chunk, plan.conv_split);
        const double scale = s.scale;
        const at::Tensor context = im.to_device(guided ? at::cat({uncond, cond}) : cond);
        // SDXL's vector input, in the same row order as the context.
        const at::Tensor y = cond_y.defined() ? im.to_device(guided ? at::cat({uncond_y, cond_y}) : cond_y) : at::Tensor();
        const int64_t rows_per_pass = plan.unet_rows;
        auto run_unet = [&](const at::Tensor& xs, const at::Tensor& ts) {
            const int64_t rows = xs.size(0);
            auto pass = [&](int64_t i, int64_t e) {
                std::vector<c10::IValue> in = {im.to_device(xs.slice(0, i, e)), ts.slice(0, i, e).to(im.device),
                                               context.slice(0, i, e)};
                if (y.defined()) in.push_back(y.slice(0, i, e));
                return im.to_host(unet.forward(in).toTensor());
            };
            if (rows <= rows_per_pass) return pass(0, rows);
            std::vector<at::Tensor> parts;
            for (int64_t i = 0; i < rows; i += rows_per_pass) parts.push_back(pass(i, std::min(rows, i + rows_per_pass)));
            return at::cat(parts);
        };
        EpsFn eps = [&](const at::Tensor& xt, const at::Tensor& t) -> at::Tensor {
            ++im.peaks.unet_evaluations;
            im.peaks.unet_rows += xt.size(0) * (guided ? 2 : 1);
            if (!guided) return run_unet(xt, t);
            auto parts = run_unet(at::cat({xt, xt}), at::cat({t, t})).chunk(2);
            return parts[0] + scale * (parts[1] - parts[0]);
        };
        StepFn on_step = nullptr;
        if (progress || im.preview)
            on_step = [&](int i, int total, const at::Tensor& xi, const at::Tensor& x0) {
                im.maybe_preview(i, total, xi, x0);
                if (progress) progress(i + 1, total);
            };
        const SamplerSettings ks{s.sampler,      s.schedule,     s.steps, parse_parameterization(c.parameterization),
                                 c.is_sdxl(),    c.linear_start, c.linear_end};
        if (first_batch) im.times.start_to_first_step = seconds_since_process_start();
        at::Tensor latents = sample(ks, eps, x, c.alphas_cumprod, im.gen, on_step).contiguous();
        // NaN turns into black pixels silently; stop instead, before anything is written.
        if (!at::isfinite(latents).all().item<bool>())
            throw RunFailure("sampling gave NaN or infinite latents, so no image was written: the model's weights may hold "
                             "NaN or Inf (a damaged or badly converted checkpoint), or --scale is too large for this "
                             "sampler and step count");
        if (plan.sequential) im.release(im.unet);
        end_stage(im.peaks.unet, im.peaks.unet_kept);

        start_measure();
        const double vae_load_before = im.times.vae_load;
        const auto decode_start = std::chrono::steady_clock::now();
        at::Tensor decoded = im.decode(latents, plan);
        im.times.last_decode = std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_start).count() -
                               (im.times.vae_load - vae_load_before);
        if (!at::isfinite(decoded).all().item<bool>())
            throw RunFailure("the VAE decoder gave NaN or infinite pixels, so no image was written: its weights may hold "
                             "NaN or Inf (a damaged or badly converted checkpoint or VAE)");
        if (plan.sequential) im.release(im.vae);
        end_stage(im.peaks.vae, im.peaks.vae_kept);
        BatchOutput out;
        out.latent_shape = latents.sizes().vec();
        out.latents.assign(latents.data_ptr<float>(), latents.data_ptr<float>() + latents.numel());
        out.images = to_images(decoded);
        return out;
    } catch (const Error&) {
        throw;
    } catch (const RunFailure&) {
        throw;
    } catch (const c10::Error& e) {
        throw std::runtime_error("model run failed: " + short_message(e));
    } catch (const std::runtime_error& e) {
        // What fails inside scripted code comes back as a runtime_error whose
        // text is the TorchScript traceback.
        throw std::runtime_error("model run failed: " + script_error_line(e.what()));
    }
}

std::unique_ptr<Pipeline> make_pipeline(const PipelineOptions& options) {
    return std::make_unique<TorchPipeline>(options);
}

}  // namespace sd
