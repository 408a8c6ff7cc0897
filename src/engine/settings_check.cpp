#include "engine/settings_check.h"

#include "core/img2img_schedule.h"
#include "core/schedule.h"
#include "engine/sampling_loop.h"
#include "sd/error.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

// --init-img and its companions (issue 33).
void check_picture_settings(const ModelConfig& c, const std::string& model_dir, const GenerateSettings& s) {
    const InitImage& init = s.init;
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
    if (init.masked_content == "latent-noise" || init.masked_content == "latent-nothing")
        throw Error("--masked-content " + init.masked_content + " is not supported yet; use fill or original");
    if (c.is_sdxl()) throw Error("--init-img on SDXL models is not supported yet (SD 1.x and 2.x only)");
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
    if (c.is_sdxl() && !s.loras.empty())
        throw Error(
            "LoRA on SDXL models is not supported yet (only SD 1.x and 2.x LoRAs merge); run without --lora "
            "and <lora:...> tags");
    check_picture_settings(c, model_dir, s);
}

}  // namespace sd
