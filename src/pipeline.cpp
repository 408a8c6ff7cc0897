#include "pipeline.h"

#include <optional>

#include <torch/script.h>

#include "error.h"
#include "model.h"
#include "runtime.h"
#include "samplers.h"
#include "tokenizer.h"

namespace sd {

struct Pipeline::Impl {
    PipelineOptions options;
    ModelConfig config;
    std::optional<ClipTokenizer> tokenizer;
    AttentionSetting attention;
    std::optional<torch::jit::Module> text_encoder, unet, vae;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);

    torch::jit::Module& stage(std::optional<torch::jit::Module>& slot, const std::string& path) {
        if (!slot) {
            slot = load_stage(path);
            set_attention(*slot, attention);
        }
        return *slot;
    }

    at::Tensor encode_text(const std::vector<std::string>& prompts) {
        const int64_t n = static_cast<int64_t>(prompts.size());
        const int64_t L = config.context_length;
        auto ids = at::empty({n, L}, at::kLong);
        for (int64_t i = 0; i < n; ++i) {
            auto row = tokenizer->encode_padded(prompts[i], config.context_length, config.bos_id, config.eos_id, config.pad_id);
            std::copy(row.begin(), row.end(), ids[i].data_ptr<int64_t>());
        }
        auto& te = stage(text_encoder, config.text_encoder_path);
        return te.forward({ids}).toTensor();
    }

    at::Tensor decode(const at::Tensor& latents) {
        auto& dec = stage(vae, config.vae_decoder_path);
        return dec.forward({latents * (1.0 / config.scale_factor)}).toTensor();
    }
};

Pipeline::Pipeline(const PipelineOptions& options) : impl_(std::make_unique<Impl>()) {
    impl_->options = options;
    impl_->attention = parse_attention(options.attention);
    impl_->config = load_model_config(options.model_dir);
    impl_->tokenizer = ClipTokenizer::load(impl_->config.vocab_path, impl_->config.merges_path);
    configure_runtime(options.threads);
}

Pipeline::~Pipeline() = default;

const ModelConfig& Pipeline::config() const { return impl_->config; }
const ClipTokenizer& Pipeline::tokenizer() const { return *impl_->tokenizer; }

void Pipeline::check(const GenerateSettings& s) const {
    const auto& c = impl_->config;
    if (!is_known_sampler(s.sampler)) throw Error("unknown sampler '" + s.sampler + "' (choose plms or ddim)");
    const int T = static_cast<int>(c.alphas_cumprod.size());
    if (s.steps < 1 || s.steps > T) throw Error("--steps must be between 1 and " + std::to_string(T) + ", got " + std::to_string(s.steps));
    for (auto [name, v] : {std::pair<const char*, int>{"--H", s.height}, {"--W", s.width}}) {
        if (v < c.size_multiple || v % c.size_multiple != 0)
            throw Error(std::string(name) + " " + std::to_string(v) + " is not a positive multiple of " +
                        std::to_string(c.size_multiple) + ", which this model needs");
    }
}

void Pipeline::seed(uint64_t seed) { impl_->gen = at::make_generator<at::CPUGeneratorImpl>(seed); }

BatchOutput Pipeline::generate(const std::vector<std::string>& prompts, const GenerateSettings& s, const ProgressFn& progress) {
    check(s);
    if (prompts.empty()) throw Error("no prompts to generate");
    auto& im = *impl_;
    const auto& c = im.config;
    c10::InferenceMode guard;
    const int64_t n = static_cast<int64_t>(prompts.size());
    const int64_t h = s.height / c.downsample_factor, w = s.width / c.downsample_factor;

    try {
        // The unconditional embedding is the encoder's output for "" (not zeros).
        at::Tensor cond = im.encode_text(prompts);
        at::Tensor uncond = im.encode_text(std::vector<std::string>(prompts.size(), ""));

        at::Tensor x = at::randn({n, c.latent_channels, h, w}, im.gen);
        auto& unet = im.stage(im.unet, c.unet_path);
        const at::Tensor context = at::cat({uncond, cond});
        const double scale = s.scale;
        EpsFn eps = [&](const at::Tensor& xt, const at::Tensor& t) -> at::Tensor {
            if (scale == 1.0) return unet.forward({xt, t, cond}).toTensor();
            auto out = unet.forward({at::cat({xt, xt}), at::cat({t, t}), context}).toTensor();
            auto parts = out.chunk(2);
            return parts[0] + scale * (parts[1] - parts[0]);
        };
        StepFn on_step = nullptr;
        if (progress) on_step = [&](int i, int total, const at::Tensor&, const at::Tensor&) { progress(i + 1, total); };
        at::Tensor latents = sample(s.sampler, eps, x, c.alphas_cumprod, s.steps, im.gen, on_step).contiguous();

        at::Tensor decoded = im.decode(latents);
        // As txt2img: clamp((x + 1) / 2, 0, 1) * 255, then truncation to uint8.
        at::Tensor pixels = (255.0 * at::clamp((decoded + 1.0) / 2.0, 0.0, 1.0)).to(at::kByte).permute({0, 2, 3, 1}).contiguous();

        BatchOutput out;
        out.latent_shape = latents.sizes().vec();
        out.latents.assign(latents.data_ptr<float>(), latents.data_ptr<float>() + latents.numel());
        const int64_t H = pixels.size(1), W = pixels.size(2);
        for (int64_t i = 0; i < n; ++i) {
            Image img;
            img.height = static_cast<int>(H);
            img.width = static_cast<int>(W);
            const uint8_t* p = pixels[i].data_ptr<uint8_t>();
            img.rgb.assign(p, p + H * W * 3);
            out.images.push_back(std::move(img));
        }
        return out;
    } catch (const c10::Error& e) {
        throw std::runtime_error("model run failed: " + short_message(e));
    }
}

}  // namespace sd
