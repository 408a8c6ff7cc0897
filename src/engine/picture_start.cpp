#include "engine/picture_start.h"

#include "image/init_pixels.h"
#include "image/mask.h"
#include "io/image_reader.h"
#include "sd/error.h"

namespace sd {

namespace {

InitPixelOptions pixel_options(const GenerateSettings& s) {
    InitPixelOptions o;
    o.width = s.width;
    o.height = s.height;
    o.resize_mode = parse_resize_mode(s.init.resize_mode, "--resize-mode");
    o.invert_mask = s.init.invert_mask;
    o.mask_blur = s.init.mask_blur;
    if (!s.init.outpaint.empty()) o.outpaint = parse_outpaint(s.init.outpaint, "--outpaint");
    o.masked_content = parse_masked_content(s.init.masked_content, "--masked-content");
    return o;
}

at::Tensor chw_tensor(const std::vector<float>& chw, int64_t channels, int64_t h, int64_t w) {
    return at::from_blob(const_cast<float*>(chw.data()), {1, channels, h, w}, at::kFloat).clone();
}

}  // namespace

PictureStart encode_picture(const GenerateSettings& s, const ModelConfig& config, VaeCodec& vae,
                            const MemoryPlan& plan) {
    const Image picture = read_image(s.init.path, "--init-img");
    GreyImage mask;
    if (!s.init.mask.empty()) mask = read_mask(s.init.mask, "--mask");
    const InitPixels px = prepare_init_pixels(picture, s.init.mask.empty() ? nullptr : &mask, pixel_options(s));
    PictureStart p;
    p.compvis = s.sampler == "ddim" && s.schedule == "default";
    p.inpaint_unet = config.is_inpainting();
    if (s.init.masked_content == "latent-noise") p.latent_fill = PictureStart::LatentFill::Noise;
    if (s.init.masked_content == "latent-nothing") p.latent_fill = PictureStart::LatentFill::Nothing;
    const int64_t H = s.height, W = s.width, f = config.downsample_factor;
    // A 9-channel UNet at strength 1 starts from noise alone: diffusers does not encode the picture then.
    if (!(p.inpaint_unet && s.init.strength >= 1.0))
        p.image_moments = vae.encode(chw_tensor(px.image_chw, 3, H, W), plan);
    if (px.has_mask()) {
        p.mask_latent = chw_tensor(px.mask_latent, 1, H / f, W / f);
        if (p.inpaint_unet) p.masked_moments = vae.encode(chw_tensor(px.masked_image_chw, 3, H, W), plan);
        if (s.init.mask_blur > 0) {
            p.original = px.original;
            p.soft_mask = px.soft_mask;
        }
    }
    return p;
}

std::vector<Image> paste_picture_back(const PictureStart& p, std::vector<Image> images) {
    if (p.soft_mask.v.empty()) return images;
    for (auto& img : images) img = paste_back(p.original, img, p.soft_mask);
    return images;
}

StartLatents draw_start(const PictureStart& p, int64_t images, int64_t channels, int64_t h, int64_t w,
                        double scale_factor, at::Generator& gen) {
    StartLatents out;
    if (p.latents.defined()) {
        if (p.latents.size(0) != images && p.latents.size(0) != 1)
            throw Error("start latents for " + std::to_string(p.latents.size(0)) + " images given to a batch of " +
                        std::to_string(images));
        out.init_latents = p.latents.size(0) == images ? p.latents : p.latents.repeat({images, 1, 1, 1});
    } else if (p.image_moments.defined()) {
        const bool one = p.image_moments.size(0) == 1;
        const at::Tensor moments = p.compvis && one ? p.image_moments.repeat({images, 1, 1, 1}) : p.image_moments;
        out.init_latents = sample_posterior(moments, scale_factor, gen);
        if (out.init_latents.size(0) != images) out.init_latents = out.init_latents.repeat({images, 1, 1, 1});
    }
    out.noise = at::randn({images, channels, h, w}, gen);
    if (p.mask_latent.defined()) {
        const at::Tensor mask = p.mask_latent.repeat({images, 1, 1, 1});
        if (out.init_latents.defined() && p.latent_fill != PictureStart::LatentFill::None) {
            out.init_latents = out.init_latents * (1 - mask);
            if (p.latent_fill == PictureStart::LatentFill::Noise)
                out.init_latents = out.init_latents + out.noise * mask;
        }
        if (p.inpaint_unet) {
            const at::Tensor masked = sample_posterior(p.masked_moments, scale_factor, gen).repeat({images, 1, 1, 1});
            out.concat = at::cat({mask, masked}, 1);
        } else {
            at::randn({1, channels, h, w}, gen);  // the masked picture's posterior, drawn and unused
            out.mask = mask;
        }
    }
    return out;
}

}  // namespace sd
