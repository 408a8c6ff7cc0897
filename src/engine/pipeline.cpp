// The LibTorch implementation of the Pipeline interface, in three phases per
// batch: text (TextConditioner) -> denoise (the sampler over Guidance over the
// UNet) -> decode (VaeCodec). The stages themselves live in LoadedStages.
#include "sd/pipeline.h"

#include <chrono>
#include <limits>
#include <optional>

#include <torch/script.h>

#include "core/schedule.h"
#include "engine/block_cache.h"
#include "engine/blocked_operators.h"
#include "engine/embeddings.h"
#include "engine/guidance.h"
#include "engine/hires_pass.h"
#include "engine/loaded_stages.h"
#include "engine/operators.h"
#include "engine/picture_start.h"
#include "engine/runtime.h"
#include "engine/sampling_loop.h"
#include "engine/settings_check.h"
#include "engine/stage_loader.h"
#include "engine/text_conditioner.h"
#include "engine/text_schedule.h"
#include "engine/vae_codec.h"
#include "engine/web_noise.h"
#include "io/embedding_file.h"
#include "kernels/attention_kernel.h"
#include "kernels/blocked_kernel.h"
#include "kernels/pointwise_bf16.h"
#include "kernels/winograd_bf16.h"
#include "memory/memory_budget.h"
#include "memory/planner.h"
#include "sd/error.h"
#include "sd/sampler_catalog.h"
#include "sd/tokenizer.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

// The GPU budget when --max-memory is not given: this LibTorch has no CUDA
// headers to ask the driver, and 4 GiB is the smallest GPU SD users run on.
constexpr double kDefaultGpuBudget = 4.0 * (1 << 30);

int schedule_steps(const GenerateSettings& s) { return prompt_schedule_steps(s.sampler, s.steps); }

}  // namespace

class TorchPipeline final : public Pipeline {
public:
    explicit TorchPipeline(const PipelineOptions& options);
    const ModelConfig& config() const override { return config_; }
    const ComputeChoice& compute() const override { return compute_; }
    void check(const GenerateSettings& s) const override;
    MemoryPlan plan(const GenerateSettings& s, int images) const override;
    const StagePeaks& measured() const override;
    const StageTimes& timings() const override { return times_; }
    void seed(uint64_t seed) override {
        gen_ = at::make_generator<at::CPUGeneratorImpl>(seed);
        noise_.seed(seed);
        hires_gen_ = at::make_generator<at::CPUGeneratorImpl>(seed);
        seed_ = seed;
        seeded_images_ = 0;
    }
    BatchOutput generate(const std::vector<std::string>& prompts, const GenerateSettings& s,
                         const ProgressFn& progress) override;
    std::vector<EmbeddingInfo> embeddings() const override;
    void set_preview(PreviewFn fn) override { vae_->set_preview(std::move(fn)); }

private:
    MemoryRequest request(const GenerateSettings& s, int images) const;
    std::vector<TextSchedule> encode_text(const std::vector<std::string>& prompts, const GenerateSettings& s,
                                          const std::vector<TextPass>& passes, const MemoryPlan& plan);
    std::optional<PictureStart> encode_picture(const GenerateSettings& s, const MemoryPlan& plan);
    at::Tensor denoise(const TextSchedule& text, const PictureStart* picture, int64_t images, const GenerateSettings& s,
                       const MemoryPlan& plan, const ProgressFn& progress, at::Generator& gen);
    at::Tensor hires_pass(const std::vector<std::string>& prompts, const TextSchedule* text, const at::Tensor& latents,
                          const GenerateSettings& s, const MemoryPlan& first_plan, const MemoryPlan& plan,
                          const ProgressFn& progress);
    at::Tensor decode(const at::Tensor& latents, const MemoryPlan& plan);

    PipelineOptions options_;
    ComputeChoice compute_;
    ModelConfig config_;
    StageTimes times_;
    mutable StagePeaks peaks_;
    std::unique_ptr<LoadedStages> stages_;  // holds references to config_ and times_
    std::unique_ptr<VaeCodec> vae_;
    std::optional<ClipTokenizer> tokenizer_;
    std::vector<Embedding> embeddings_;  // textual inversion
    std::unique_ptr<TextConditioner> text_;
    MemoryModel memory_;
    double base_rss_ = 0;
    at::Generator gen_ = at::make_generator<at::CPUGeneratorImpl>(0);
    RunNoise noise_;  // the start noise and the sampler's draws: gen_'s, or the web UI's (NoiseSettings)
    // The hires fix's second passes draw from their own generator, seeded with
    // gen_: they start as a separate img2img run with the same seed would.
    at::Generator hires_gen_ = at::make_generator<at::CPUGeneratorImpl>(0);
    // The web UI's image seeds: seed_ + the images made since seed(); batch_seed_ is this batch's first.
    uint64_t seed_ = 0, seeded_images_ = 0, batch_seed_ = 0;
};

TorchPipeline::TorchPipeline(const PipelineOptions& options) : options_(options) {
    if (options.attention != "auto") parse_attention(options.attention);  // reject bad names up front
    for (const std::string& problem : {kernels::attention_isa_problem(), kernels::blocked_isa_problem()})
        if (!problem.empty()) throw Error(problem);  // a misspelt kernel switch, before anything loads
    compute_ = resolve_compute(options);
    if (options.batch_size && *options.batch_size < 1) throw Error("--batch-size must be at least 1");
    if (options.vae_tile && *options.vae_tile < 0) throw Error("--vae-tiling takes auto, on, off or a tile size");
    config_ = load_model_config(options.model_dir);
    match_weight_file(compute_, options, config_);
    const bool full_vae = options.vae_decoder.empty();
    for (const auto* stage : {&config_.text_encoder_path, &config_.unet_path, &config_.vae_decoder_path,
                              &config_.text_encoder_2_path, &config_.vae_encoder_path})
        if (!stage->empty() && (full_vae || stage != &config_.vae_decoder_path)) check_stage_files(*stage);
    stages_ = std::make_unique<LoadedStages>(options, config_, compute_, times_);
    vae_ = std::make_unique<VaeCodec>(options, *stages_);
    memory_ = memory_model(config_);
    if (vae_->taesd()) set_taesd_stage(memory_, vae_->taesd()->channels(), vae_->taesd()->weight_bytes());
    tokenizer_ = ClipTokenizer::load(config_.vocab_path, config_.merges_path);
    // SDXL: A1111's clip_l / clip_g pairs, one vector set per text encoder.
    const bool sdxl = config_.is_sdxl();
    embeddings_ = load_embeddings(embedding_files(options.embeddings, options.embeddings_dir),
                                  sdxl ? config_.sdxl.text_encoder_width : config_.context_dim,
                                  config_.context_length - 2, sdxl ? config_.sdxl.text_encoder_2_width : 0);
    text_ = sdxl ? make_sdxl_conditioner(*stages_, *tokenizer_, embeddings_, &peaks_.text_rows)
                 : make_clip_conditioner(*stages_, *tokenizer_, embeddings_, &peaks_.text_rows);
    configure_runtime(options.threads);
    noise_.record(options.record_noise);
    base_rss_ = static_cast<double>(current_rss_bytes());
}

const StagePeaks& TorchPipeline::measured() const {
    const auto c = block_cache_stats();
    peaks_.large_blocks = static_cast<long long>(c.hits + c.misses);
    peaks_.reused_blocks = static_cast<long long>(c.hits);
    return peaks_;
}

std::vector<EmbeddingInfo> TorchPipeline::embeddings() const {
    std::vector<EmbeddingInfo> out;
    for (const auto& e : embeddings_) out.push_back({e.trigger, e.hash, e.path});
    return out;
}

void TorchPipeline::check(const GenerateSettings& s) const {
    check_settings(config_, options_.model_dir, s);
    for (const auto& lora : s.loras) stages_->lora_file(lora);  // read and matched before any stage loads
}

MemoryRequest TorchPipeline::request(const GenerateSettings& s, int images) const {
    MemoryRequest r;
    r.height = s.height;
    r.width = s.width;
    r.images = images;
    r.guidance = s.scale != 1.0;
    r.encode = s.init.active();
    const bool cpu = stages_->device().is_cpu();
    if (options_.max_memory > 0) {
        r.budget = options_.max_memory;
    } else if (cpu) {
        const MemoryBudget b = memory_budget(this_process_memory());
        r.budget = b.bytes;
        r.budget_from_cgroup = b.from_cgroup;
    } else {
        r.budget = kDefaultGpuBudget;
    }
    r.sequential = options_.sequential;
    if (options_.attention != "auto") r.attention = parse_attention(options_.attention);
    if (options_.batch_size) r.unet_rows = *options_.batch_size * (r.guidance ? 2 : 1);
    if (options_.vae_tile) r.vae_tile = *options_.vae_tile;
    r.half_weights = stages_->held_type() != at::kFloat;
    r.half_text = stages_->text_type() != at::kFloat;
    r.q8_weights = stages_->q8_unet();
    if (stages_->q8_unet() && stages_->prepack_applies_to_vae())  // a q8 UNet is never prepacked: the VAE's alone
        r.prepack = stages_->vae_decoder_loaded() ? std::optional<bool>(stages_->vae_packed()) : options_.prepack;
    else if (!stages_->prepack_applies_to_unet())
        r.prepack = false;
    else if (stages_->unet_loaded())
        r.prepack = stages_->unet_packed();
    else
        r.prepack = options_.prepack;
    if (!stages_->winograd_applies_to_unet() || !r.prepack.value_or(true))
        r.winograd = false;
    else if (stages_->unet_loaded())
        r.winograd_levels = stages_->unet_winograd_levels();
    else
        r.winograd = options_.winograd;
    r.winograd_added_floats = winograd_added_floats();
    std::tie(r.text_lora, r.unet_lora) = stages_->lora_bytes(s.loras);
    if (cpu && stages_->compute_type() == at::kBFloat16) {
        // sd::conv1x1's sums, kept for the whole run
        r.unet_scratch_bytes = r.vae_scratch_bytes = static_cast<double>(kernels::pointwise_bf16_scratch_bytes());
        if (options_.winograd.value_or(true) && kernels::winograd_bf16_available()) {
            r.unet_scratch_bytes +=
                static_cast<double>(kernels::winograd_bf16_scratch_bytes(static_cast<int64_t>(conv_split_bytes() / 4)));
            const int64_t vae_ch = memory_.vae_mid_channels;  // the VAE's widest 3x3 layers
            r.vae_scratch_bytes += static_cast<double>(kernels::winograd_bf16_scratch_bytes(vae_ch * vae_ch * 9));
        }
    }
    return r;
}

MemoryPlan TorchPipeline::plan(const GenerateSettings& s, int images) const {
    // On a GPU the budget is the device's memory, which the host RSS does not touch.
    const bool cpu = stages_->device().is_cpu();
    // A hires batch's largest canvas is its second pass's, with the encoder for lanczos.
    MemoryRequest r = request(s.hires.active() ? hires_pass_settings(s, config_.size_multiple) : s, images);
    if (s.hires.active()) r.encode = s.hires.upscaler == "lanczos";
    MemoryPlan p = plan_memory(memory_, r, cpu ? base_rss_ : 0);
    p.compute = compute_.describe();
    if (!cpu) {  // GPU headroom is no host memory
        p.block_cache = 0;
        p.text.kept = p.unet.kept = p.vae.kept = 0;
    }
    return p;
}

// Text: the unconditional embedding is the encoder's output for "" (not
// zeros). Scale 1 is the cond alone: the negative prompt is not even encoded
// (diffusers' guidance_scale <= 1). One schedule per pass (A1111's prompt
// editing and alternation; engine/text_schedule.h), every pass encoded as s says
// (SDXL's size conditioning), each distinct text once.
std::vector<TextSchedule> TorchPipeline::encode_text(const std::vector<std::string>& prompts, const GenerateSettings& s,
                                                     const std::vector<TextPass>& passes, const MemoryPlan& plan) {
    const StageMeter meter(options_.measure_stages);
    const bool first_batch = times_.start_to_first_step == 0;
    const double start = seconds_since_process_start(), load_before = times_.text_load;
    // Scale 1 needs the unconditional side only for A1111's composed prompts (AND, "text:0.5").
    const bool guided = s.scale != 1.0 || (s.prompt_weights && composes(prompts));
    // Texts beyond the first set (an edited prompt's) take what the plan leaves.
    const double room =
        plan.budget > 0 ? std::max(0.0, plan.budget - plan.peak()) : std::numeric_limits<double>::infinity();
    TextScheduler scheduler(
        [&](const std::vector<std::string>& p, const std::vector<std::string>& n) { return text_->encode(p, n, s); },
        room);
    const std::vector<std::string> negatives(guided ? prompts.size() : 0, s.negative_prompt);
    std::vector<TextSchedule> out;
    for (const TextPass& pass : passes)
        out.push_back(scheduler.pass(prompts, negatives, s.prompt_weights, pass.steps, pass.first_pass_steps));
    if (first_batch)
        times_.first_text_encode = seconds_since_process_start() - start - (times_.text_load - load_before);
    if (plan.sequential) stages_->release_text_encoders();
    meter.end(peaks_.text, peaks_.text_kept);
    return out;
}

// A picture to start from (--init-img), through the VAE encoder.
std::optional<PictureStart> TorchPipeline::encode_picture(const GenerateSettings& s, const MemoryPlan& plan) {
    if (s.init.from_latents()) {
        PictureStart p;
        p.compvis = s.sampler == "ddim" && s.schedule == "default";
        const auto& shape = s.init.latent_shape;
        p.latents = at::from_blob(const_cast<float*>(s.init.latents.data()), shape, at::kFloat).clone();
        return p;
    }
    if (!s.init.active()) return std::nullopt;
    const StageMeter meter(options_.measure_stages);
    const double load_before = times_.encode_load;
    const auto start = std::chrono::steady_clock::now();
    PictureStart p = sd::encode_picture(s, config_, *vae_, plan);
    times_.last_encode = seconds_since(start) - (times_.encode_load - load_before);
    // Used once a batch and not in the memory plan yet: never kept beside the UNet.
    stages_->release_vae_encoder();
    meter.end(peaks_.encode, peaks_.encode_kept);
    return p;
}

// Sampling from the seed's start noise, the UNet run in passes of at most plan.unet_rows rows.
at::Tensor TorchPipeline::denoise(const TextSchedule& text, const PictureStart* picture, int64_t images,
                                  const GenerateSettings& s, const MemoryPlan& plan, const ProgressFn& progress,
                                  at::Generator& gen) {
    const StageMeter meter(options_.measure_stages);
    const int64_t h = s.height / config_.downsample_factor, w = s.width / config_.downsample_factor;
    const bool first_batch = times_.start_to_first_step == 0;
    StartLatents start;
    if (picture) start = draw_start(*picture, images, config_.latent_channels, h, w, config_.scale_factor, gen);
    start.noise =
        noise_.start(s.noise, gen, {images, config_.latent_channels, h, w}, config_.downsample_factor, start.noise);
    auto& unet = stages_->unet();
    set_attention(unet, {plan.attention_mode, plan.attention_chunk});
    set_layer_memory(unet, plan.ff_chunk, plan.conv_split);
    const LoadedStages& st = *stages_;
    auto on_device = [&](const at::Tensor& t) { return t.defined() ? st.to_device(t) : t; };
    const UnetFn unet_fn = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& context,
                               const at::Tensor& y) {
        std::vector<c10::IValue> in = {st.to_device(x), t.to(st.device()), context};
        if (y.defined()) in.push_back(y);
        return LoadedStages::to_host(unet.forward(in).toTensor());
    };
    TextSchedule on_unet = text;
    for (UnetConditioning& c : on_unet.texts)
        c = {on_device(c.cond), on_device(c.uncond), on_device(c.cond_y), on_device(c.uncond_y)};
    Guidance guidance(unet_fn, on_unet, on_device(start.concat), s.scale, plan.unet_rows);
    StepFn on_step = nullptr;
    if (progress || vae_->previews())
        on_step = [&](int i, int total, const at::Tensor& xi, const at::Tensor& x0) {
            vae_->maybe_preview(i, total, xi, x0);
            if (progress) progress(i + 1, total);
        };
    SamplerSettings ks{
        s.sampler,         s.schedule,           s.steps,           parse_parameterization(config_.parameterization),
        config_.is_sdxl(), config_.linear_start, config_.linear_end};
    if (picture) ks.strength = s.init.strength;
    ks.eta = s.noise.eta;
    ks.brownian_tree = s.noise.brownian_tree;
    ks.beta_alpha = s.beta_alpha;
    ks.beta_beta = s.beta_beta;
    for (int64_t i = 0; i < images; ++i) ks.seeds.push_back(batch_seed_ + static_cast<uint64_t>(i));
    // A 4-channel UNet inpaints by blending the picture's latents back in after each step.
    std::optional<InpaintBlend> blend;
    if (start.mask.defined()) blend = InpaintBlend{start.mask};
    if (first_batch) times_.start_to_first_step = seconds_since_process_start();
    if (progress) progress(0, 0);
    at::Tensor latents = sample(ks, std::ref(guidance), start.noise, config_.alphas_cumprod, noise_.steps(), on_step,
                                start.init_latents, blend ? &*blend : nullptr)
                             .contiguous();
    peaks_.unet_evaluations += guidance.evaluations();
    peaks_.unet_rows = guidance.rows();
    // NaN turns into black pixels silently; stop instead, before anything is written.
    if (!at::isfinite(latents).all().item<bool>())
        throw RunFailure(
            "sampling gave NaN or infinite latents, so no image was written: the model's weights may hold "
            "NaN or Inf (a damaged or badly converted checkpoint), or --scale is too large for this "
            "sampler and step count");
    if (plan.sequential) stages_->release_unet();
    meter.end(peaks_.unet, peaks_.unet_kept);
    return latents;
}

// The hires fix's second pass: the first pass's latents (lanczos: its decoded
// images) upscaled, then img2img at the hires size from hires_gen_.
at::Tensor TorchPipeline::hires_pass(const std::vector<std::string>& prompts, const TextSchedule* text,
                                     const at::Tensor& latents, const GenerateSettings& s, const MemoryPlan& first_plan,
                                     const MemoryPlan& plan, const ProgressFn& progress) {
    const GenerateSettings second = hires_pass_settings(s, config_.size_multiple);
    std::vector<Image> images;
    if (s.hires.upscaler == "lanczos") images = to_images(decode(latents, first_plan));
    std::optional<PictureStart> start;
    {
        const StageMeter meter(options_.measure_stages);
        const double load_before = times_.encode_load;
        const auto begin = std::chrono::steady_clock::now();
        start = hires_start(second, s.hires.upscaler, config_, latents, images, *vae_, plan);
        stages_->release_vae_encoder();
        if (!images.empty()) {
            times_.last_encode = seconds_since(begin) - (times_.encode_load - load_before);
            meter.end(peaks_.encode, peaks_.encode_kept);
        }
    }
    // SDXL's size conditioning is the image's size: the second pass's text is encoded at it
    // (text is null then).
    const TextSchedule second_text =
        text ? *text : encode_text(prompts, second, {{schedule_steps(second), schedule_steps(s)}}, plan)[0];
    return denoise(second_text, &*start, static_cast<int64_t>(prompts.size()), second, plan, progress, hires_gen_);
}

at::Tensor TorchPipeline::decode(const at::Tensor& latents, const MemoryPlan& plan) {
    const StageMeter meter(options_.measure_stages);
    const double load_before = times_.vae_load;
    const auto start = std::chrono::steady_clock::now();
    at::Tensor decoded = vae_->decode(latents, plan);
    times_.last_decode = seconds_since(start) - (times_.vae_load - load_before);
    if (!at::isfinite(decoded).all().item<bool>())
        throw RunFailure(
            "the VAE decoder gave NaN or infinite pixels, so no image was written: its weights may hold "
            "NaN or Inf (a damaged or badly converted checkpoint or VAE)");
    if (plan.sequential) stages_->release_vae_decoder();
    meter.end(peaks_.vae, peaks_.vae_kept);
    return decoded;
}

BatchOutput TorchPipeline::generate(const std::vector<std::string>& prompts, const GenerateSettings& s,
                                    const ProgressFn& progress) {
    check(s);
    if (prompts.empty()) throw Error("no prompts to generate");
    batch_seed_ = seed_ + seeded_images_;
    seeded_images_ += prompts.size();
    stages_->use_loras(s.loras);
    const int n = static_cast<int>(prompts.size());
    const MemoryPlan plan = this->plan(s, n);  // hires: the second pass's (the largest canvas)
    GenerateSettings first = s;
    first.hires = HiresFix{};
    const MemoryPlan first_plan = s.hires.active() ? this->plan(first, n) : plan;
    set_block_cache_limit(static_cast<size_t>(plan.block_cache));
    stages_->set_prepack(plan.prepack);
    // Winograd weights for the first pass's size, which the UNet loads for: level l runs
    // at the latent size / 2^l.
    WinogradChoice winograd;
    for (int level = 0; level < plan.winograd_levels; ++level) {
        const int64_t div = int64_t{config_.downsample_factor} << level;
        winograd.levels.push_back({memory_.unet_level_channels[static_cast<size_t>(level)],
                                   {first_plan.unet_rows, s.height / div, s.width / div}});
    }
    stages_->set_winograd(winograd);
    // The VAE's per-call form holds no weights, so only --winograd off turns it off.
    stages_->set_vae_winograd(options_.winograd.value_or(true) && winograd_available());
    // bf16's (sd::conv3x3) hold no weights either: scratch for one layer at a time.
    set_bf16_winograd(options_.winograd.value_or(true));
    stages_->set_bf16_winograd_latent(s.height / config_.downsample_factor, s.width / config_.downsample_factor);
    c10::InferenceMode guard;
    peaks_ = {};
    try {
        // A hires fix's second pass schedules the same text over its own steps; SDXL's
        // encodes it again at its size (hires_pass).
        std::vector<TextPass> passes = {{schedule_steps(s), 0}};
        const bool second_here = s.hires.active() && !config_.is_sdxl();
        if (second_here)
            passes.push_back({schedule_steps(hires_pass_settings(s, config_.size_multiple)), schedule_steps(s)});
        const std::vector<TextSchedule> text = encode_text(prompts, s, passes, first_plan);
        const std::optional<PictureStart> picture = encode_picture(s, plan);
        at::Tensor latents = denoise(text[0], picture ? &*picture : nullptr, static_cast<int64_t>(prompts.size()), s,
                                     first_plan, progress, gen_);
        if (s.hires.active())
            latents = hires_pass(prompts, second_here ? &text[1] : nullptr, latents, s, first_plan, plan, progress);
        const at::Tensor decoded = decode(latents, plan);
        BatchOutput out;
        out.latent_shape = latents.sizes().vec();
        out.latents.assign(latents.data_ptr<float>(), latents.data_ptr<float>() + latents.numel());
        if (const at::Tensor n = noise_.recorded(); n.defined()) {
            out.noise_shape = n.sizes().vec();
            out.noise.assign(n.data_ptr<float>(), n.data_ptr<float>() + n.numel());
        }
        out.images = picture ? paste_picture_back(*picture, to_images(decoded)) : to_images(decoded);
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
