#include "engine/settings_check.h"

#include "core/img2img_schedule.h"
#include "core/schedule.h"
#include "engine/sampling_loop.h"
#include "engine/web_noise.h"
#include "sd/error.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

// --init-img and its companions (issue 33).
void check_picture_settings(const ModelConfig& c, const std::string& model_dir, const GenerateSettings& s) {
    const InitImage& init = s.init;
    if (init.from_latents()) {
        const auto& shape = init.latent_shape;
        const int64_t f = c.downsample_factor;
        int64_t count = 1;
        for (int64_t d : shape) count *= d;
        if (init.active() || !init.mask.empty() || !init.outpaint.empty() || c.is_inpainting())
            throw Error("start latents take no picture, mask or outpaint, and no inpainting model");
        if (shape.size() != 4 || shape[1] != c.latent_channels || shape[2] != s.height / f || shape[3] != s.width / f ||
            count != static_cast<int64_t>(init.latents.size()))
            throw Error("start latents must be [n, " + std::to_string(c.latent_channels) + ", H/" + std::to_string(f) +
                        ", W/" + std::to_string(f) + "] for the settings' size");
        check_strength("--strength", init.strength);
        if (s.sampler == "plms") throw Error("start latents need another sampler than plms");
        return;
    }
    if (!init.active()) {
        if (c.is_inpainting())
            throw Error("model " + model_dir +
                        " is an inpainting model (its UNet takes a mask): give --init-img "
                        "and --mask (or --outpaint)");
        if (!init.mask.empty() || !init.outpaint.empty())
            throw Error(std::string(init.mask.empty() ? "--outpaint" : "--mask") +
                        " needs --init-img, the picture to "
                        "paint into");
        return;
    }
    check_strength("--strength", init.strength);
    if (c.vae_encoder_path.empty())
        throw Error("model " + model_dir +
                    " has no VAE encoder, which --init-img needs: it was exported before "
                    "img2img; export it again with scripts/export_model.py (text to image keeps working as it is)");
    if (s.sampler == "plms")
        throw Error(
            "--init-img needs another sampler than plms (CompVis img2img has none): use ddim, a "
            "k-diffusion sampler or lcm");
    if (c.is_inpainting() && init.mask.empty() && init.outpaint.empty())
        throw Error("model " + model_dir + " is an inpainting model: give --mask (or --outpaint) with --init-img");
    if ((init.masked_content == "latent-noise" || init.masked_content == "latent-nothing") && init.mask.empty() &&
        init.outpaint.empty())
        throw Error("--masked-content " + init.masked_content + " needs a mask (--mask or --outpaint)");
}

// The hires fix (--hires-*): what its second pass needs, before the first runs.
void check_hires_settings(const ModelConfig& c, const std::string& model_dir, const GenerateSettings& s) {
    const HiresFix& h = s.hires;
    if (!h.active()) return;
    if (s.init.active() || s.init.from_latents())
        throw Error(
            "--hires-scale/--hires-size is a second pass after text to image; it does not take --init-img "
            "(run the upscaled picture with --init-img and --strength instead)");
    if (h.scale < 0 || (h.scale > 0 && (h.width > 0 || h.height > 0)))
        throw Error("give one of --hires-scale F (F > 0) and --hires-size WxH");
    if (h.upscaler != "latent" && h.upscaler != "latent-nearest" && h.upscaler != "lanczos")
        throw Error("--hires-upscaler takes latent, latent-nearest or lanczos, got \"" + h.upscaler + "\"");
    check_strength("--hires-strength", h.strength);
    // The web UI seeds its second pass afresh at the new size; this tool's second
    // pass has its own CPU generator only, so other noise would silently differ.
    if (uses_web_noise(s.noise))
        throw Error(
            "the hires fix runs with the tool's own CPU noise only, not with --rng nv, --ensd, --subseed or "
            "--seed-resize-from (a web UI hires PNG cannot be remade yet)");
    if (s.sampler == "plms")
        throw Error(
            "--hires-scale needs another sampler than plms, which cannot start its second pass from a picture: "
            "use ddim, a k-diffusion sampler or lcm");
    if (h.upscaler == "lanczos" && c.vae_encoder_path.empty())
        throw Error("model " + model_dir +
                    " has no VAE encoder, which --hires-upscaler lanczos needs: export it again with "
                    "scripts/export_model.py, or use --hires-upscaler latent");
    const auto [w, h2] = h.size(s.width, s.height, c.size_multiple);
    for (auto [name, v] : {std::pair<const char*, int>{"width", w}, {"height", h2}}) {
        if (v < c.size_multiple || v % c.size_multiple != 0 || v > 16384)
            throw Error(std::string("the hires fix's ") + name + " " + std::to_string(v) +
                        " is not a positive multiple of " + std::to_string(c.size_multiple) +
                        " up to 16384, which this model needs (--hires-scale / --hires-size)");
    }
    const int T = static_cast<int>(c.alphas_cumprod.size());
    if (h.steps < 0 || h.steps > T)
        throw Error("--hires-steps must be between 0 (the first pass's steps) and " + std::to_string(T) + ", got " +
                    std::to_string(h.steps));
    sampler_step_count(s.sampler, s.schedule, h.steps > 0 ? h.steps : s.steps, T);
}

}  // namespace

void check_settings(const ModelConfig& c, const std::string& model_dir, const GenerateSettings& s) {
    check_sampler_settings(s.sampler, s.schedule, s.steps);
    check_beta_parameter("--beta-alpha", s.beta_alpha);
    check_beta_parameter("--beta-beta", s.beta_beta);
    check_brownian_tree(s.noise.brownian_tree);
    parse_parameterization(c.parameterization);
    const int T = static_cast<int>(c.alphas_cumprod.size());
    if (s.steps < 1 || s.steps > T)
        throw Error("--steps must be between 1 and " + std::to_string(T) +
                    ", the number of timesteps in this model's noise " + "schedule (model.json alphas_cumprod), got " +
                    std::to_string(s.steps));
    sampler_step_count(s.sampler, s.schedule, s.steps, T);  // rejects CompVis counts whose schedule runs past T-1
    check_clip_skip("--clip-skip", s.clip_skip, c.text_layers_used);
    for (auto [name, v] : {std::pair<const char*, int>{"--H", s.height}, {"--W", s.width}}) {
        if (v < c.size_multiple || v % c.size_multiple != 0)
            throw Error(std::string(name) + " " + std::to_string(v) + " is not a positive multiple of " +
                        std::to_string(c.size_multiple) + ", which this model needs");
    }
    const bool size_flags =
        s.original_width || s.original_height || s.target_width || s.target_height || s.crop_top || s.crop_left;
    if (size_flags && !c.is_sdxl())
        throw Error("--original-size, --crop-coords and --target-size are SDXL's size conditioning; this model is " +
                    (c.family == "sd1" ? std::string("SD 1.x") : std::string("SD 2.x")) + ", which has none");
    check_picture_settings(c, model_dir, s);
    check_hires_settings(c, model_dir, s);
}

}  // namespace sd
