#include "engine/hires_pass.h"

#include "image/init_pixels.h"
#include "image/lanczos.h"

namespace sd {

GenerateSettings hires_pass_settings(const GenerateSettings& s, int size_multiple) {
    GenerateSettings second = s;
    std::tie(second.width, second.height) = s.hires.size(s.width, s.height, size_multiple);
    if (s.hires.steps > 0) second.steps = s.hires.steps;
    second.init = InitImage{};
    second.init.strength = s.hires.strength;
    second.hires = HiresFix{};
    return second;
}

at::Tensor upscale_latents(const at::Tensor& latents, int64_t h2, int64_t w2, const std::string& upscaler) {
    if (upscaler == "latent-nearest") return at::upsample_nearest2d(latents, {h2, w2});
    return at::upsample_bilinear2d(latents, {h2, w2}, /*align_corners=*/false);
}

PictureStart hires_start(const GenerateSettings& second, const std::string& upscaler, const ModelConfig& config,
                         const at::Tensor& latents, const std::vector<Image>& images, VaeCodec& vae,
                         const MemoryPlan& plan) {
    PictureStart p;
    p.compvis = second.sampler == "ddim" && second.schedule == "default";
    const int64_t f = config.downsample_factor;
    if (upscaler != "lanczos") {
        p.latents = upscale_latents(latents, second.height / f, second.width / f, upscaler);
        return p;
    }
    InitPixelOptions o;
    o.width = second.width;
    o.height = second.height;
    o.latent_factor = static_cast<int>(f);
    std::vector<at::Tensor> moments;
    for (const Image& img : images) {
        const InitPixels px = prepare_init_pixels(lanczos_resize(img, second.width, second.height), nullptr, o);
        const at::Tensor chw =
            at::from_blob(const_cast<float*>(px.image_chw.data()), {1, 3, second.height, second.width}, at::kFloat)
                .clone();
        moments.push_back(vae.encode(chw, plan));
    }
    p.image_moments = at::cat(moments);
    return p;
}

}  // namespace sd
