// Inpainting masks (255 = repaint, 0 = keep) from the file to what the
// engine needs, following ../shared/conformance/inpaint/README.md (diffusers
// v0.26.3 VaeImageProcessor and StableDiffusionInpaintPipeline) for the
// binarised mask, the masked image and the latent-size mask, and
// AUTOMATIC1111 (modules/processing.py, StableDiffusionProcessingImg2Img.init)
// for --invert-mask and --mask-blur.
//
// Order, as A1111: read (convert("L"), io/image_reader.h) -> resize with the
// picture's resize mode (image/resize.h fit_grey) -> invert -> blur -> the
// soft mask; then binarise for the model (diffusers: >= 128 repaints).
// Mask size: a mask must have the size of the init picture it goes with
// (check_mask_size); it is never stretched on its own.
#pragma once
#include <string>
#include <vector>

#include "sd/image.h"

namespace sd {

// Refuses (sd::Error, one line naming `what`) a mask whose size is not the
// picture's: a mask drawn for another picture would land on the wrong pixels.
void check_mask_size(const GreyImage& mask, int image_w, int image_h, const std::string& what);

// 255 - v (A1111's ImageOps.invert; --invert-mask).
GreyImage invert_mask(const GreyImage& mask);

// A1111's mask blur of radius r (--mask-blur): a Gaussian of sigma r with a
// kernel of mask_blur_kernel_size(r) taps, first along rows, then along
// columns, each pass rounded back to 8 bits (A1111 calls cv2.GaussianBlur with
// ksize (k, 1), then (1, k), on the uint8 mask). Borders mirror without
// repeating the edge pixel (OpenCV's default BORDER_REFLECT_101). r = 0 returns
// the mask unchanged. The weights are computed in double, not in OpenCV's
// fixed point: a pixel may differ from OpenCV's by one level.
GreyImage blur_mask(const GreyImage& mask, int radius);
int mask_blur_kernel_size(int radius);  // 2 * int(2.5 r + 0.5) + 1

// diffusers' binarisation: 1 where v >= 128 (v / 255 >= 0.5 in float32), else 0;
// [H * W] floats, row-major (mask.npy).
std::vector<float> binarize_mask(const GreyImage& mask);

// The latent-size mask: torch's nearest interpolation to (H / f, W / f), i.e.
// the top-left pixel of each f x f block, mask[f i, f j] (mask_latent.npy).
// `mask` is [h * w] as binarize_mask gives; h and w must be multiples of f.
std::vector<float> latent_mask(const std::vector<float>& mask, int w, int h, int factor);

// The picture as the VAE encoder takes it: [3, H, W] floats, x / 255 * 2 - 1
// in float32, exactly as numpy computes it (init_image.npy).
std::vector<float> image_to_chw(const Image& img);

// diffusers' masked image: image_chw * (mask < 0.5), the repainted pixels set
// to 0.0 (mid-grey in [-1, 1]) (masked_image.npy).
std::vector<float> masked_image_chw(const std::vector<float>& image_chw, const std::vector<float>& mask);

// A1111's overlay of the original over the result: each pixel
// round((generated * m + original * (255 - m)) / 255) with m the soft mask, so
// kept pixels (m = 0) are exactly the original and a blurred edge blends.
// diffusers does not do this (its kept area is the VAE's reconstruction).
Image paste_back(const Image& original, const Image& generated, const GreyImage& mask);

}  // namespace sd
