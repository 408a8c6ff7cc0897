// A batch that starts from a picture (--init-img; issue 33): img2img,
// inpainting and outpainting. The picture and its mask are read and prepared
// without LibTorch (src/image/init_pixels.h), encoded by the VAE encoder, and
// the start's random draws are made in the references' order.
#pragma once
#include <cstdint>

#include <ATen/ATen.h>

#include "engine/vae_codec.h"
#include "sd/pipeline.h"

namespace sd {

struct PictureStart {
    // [1, 2C, h, w], or [n, 2C, h, w] one per image (the hires fix's lanczos
    // upscale); undefined: the start is noise alone (inpainting at strength 1)
    at::Tensor image_moments;
    at::Tensor latents;         // [n, C, h, w] start latents as they are (the hires fix's latent upscale): no draw
    at::Tensor masked_moments;  // [1, 2C, h, w]: the masked picture's (a 9-channel UNet's input)
    at::Tensor mask_latent;     // [1, 1, h, w], 1 = repaint; undefined without a mask
    bool compvis = false;       // CompVis img2img.py: n copies of the picture, n posterior draws
    bool inpaint_unet = false;  // the UNet takes the mask and the masked latents as 5 more channels
    // A1111's latent masked-content modes: the masked area of the init latents
    // replaced by the start noise ("latent noise"; A1111 draws its fill from
    // the image seeds its start noise comes from, so the two are the same) or by zeros.
    enum class LatentFill { None, Noise, Nothing } latent_fill = LatentFill::None;
    // With --mask-blur: A1111's overlay of the picture over the result through
    // the blurred mask (the references, with no blur, leave the VAE's pixels).
    Image original;
    GreyImage soft_mask;
};

// The result as A1111 shows an inpainting with a blurred mask: each image
// overlaid by the original picture through the soft mask (kept pixels exact).
// Images are returned as they are when the start has no soft mask to apply.
std::vector<Image> paste_picture_back(const PictureStart& p, std::vector<Image> images);

// Reads, prepares and encodes the batch's picture. Throws sd::Error for a
// picture or mask that cannot be used, naming the file.
PictureStart encode_picture(const GenerateSettings& s, const ModelConfig& config, VaeCodec& vae,
                            const MemoryPlan& plan);

// What the sampler starts from, drawn from gen in the references' order: the
// picture's posterior (CompVis: [n, ...], diffusers: [1, ...] repeated; one
// draw of [n, ...] where there are n moment sets), or given latents, the
// start noise [n, C, h, w], then the masked picture's posterior (diffusers
// draws it even for a 4-channel UNet, which does not use it).
struct StartLatents {
    at::Tensor noise;         // the start noise
    at::Tensor init_latents;  // scale_factor * posterior sample, [n, C, h, w]; undefined: noise alone
    at::Tensor concat;        // 9-channel UNet: [n, 1 + C, h, w] mask and masked latents
    at::Tensor mask;          // [n, 1, h, w] latent-size mask, for a 4-channel UNet's blending
};
StartLatents draw_start(const PictureStart& p, int64_t images, int64_t channels, int64_t h, int64_t w,
                        double scale_factor, at::Generator& gen);

}  // namespace sd
