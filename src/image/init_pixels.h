// Everything img2img, inpainting and outpainting take from pixels, in one
// call, for the engine to wrap as tensors (no LibTorch here).
//
// Order (A1111's, with diffusers' arithmetic where the references fix it):
//  1. outpaint: the canvas grows, the new area masked (a --mask given too is
//     placed on the canvas and joined with it);
//  2. the picture and its mask brought to width x height with the resize mode
//     (not resized when already at the size, as in every reference case);
//  3. the mask inverted (--invert-mask), then blurred (--mask-blur): the soft mask;
//  4. masked content "fill": the masked area of the picture filled from the
//     kept area (using the soft mask, as A1111 fills with its blurred mask);
//  5. the tensors: the picture in [-1, 1], the binarised mask, the masked
//     picture and the latent-size mask, exactly as diffusers makes them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "image/outpaint.h"
#include "image/resize.h"
#include "sd/image.h"

namespace sd {

struct InitPixelOptions {
    int width = 0, height = 0;  // the run's size; 0 keeps the picture's (after outpainting)
    ResizeMode resize_mode = ResizeMode::Just;
    bool invert_mask = false;
    int mask_blur = 0;
    std::optional<OutpaintMargins> outpaint;
    // Original for an inpaint mask matches the references (diffusers encodes
    // the picture as it is); A1111's outpainting scripts default to Fill. The
    // latent modes leave the pixels as Original: the engine replaces the
    // masked init latents (outpaint.h).
    MaskedContent masked_content = MaskedContent::Original;
    int latent_factor = 8;
    std::string mask_what = "--mask";  // names the mask in messages
};

struct InitPixels {
    Image original;                // the picture at width x height before any fill (what paste_back puts back)
    Image image;                   // the picture the encoder gets (filled where the mask says, for Fill)
    std::vector<float> image_chw;  // [3, H, W] in [-1, 1] (init_image.npy)
    // Empty without a mask or outpaint:
    GreyImage soft_mask;                  // after invert and blur, 0..255 (for paste_back)
    std::vector<float> mask;              // [H * W] 0 / 1 (mask.npy)
    std::vector<float> masked_image_chw;  // [3, H, W] (masked_image.npy)
    std::vector<float> mask_latent;       // [H / f * W / f] (mask_latent.npy for one sample)
    bool has_mask() const { return !mask.empty(); }
};

// `mask` may be null (img2img). A mask must have the picture's size (refused
// with one line naming options.mask_what otherwise); width and height must be
// multiples of latent_factor when there is a mask. Throws sd::Error.
InitPixels prepare_init_pixels(const Image& picture, const GreyImage* mask, const InitPixelOptions& options);

}  // namespace sd
