// The hires fix's second pass (A1111's StableDiffusionProcessingTxt2Img
// sample_hr_pass): the first pass's result upscaled, then img2img at the new
// size. It starts exactly as an --init-img run of the upscaled result would,
// with a generator seeded as the first pass's was (the pipeline keeps one for
// the second passes), so that a hires run equals a txt2img run, the upscale
// and a separate img2img run (tests/cli/test_hires.cpp).
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "engine/picture_start.h"

namespace sd {

// The second pass's settings: the hires size, --hires-steps (0: the first
// pass's steps) and --hires-strength; no hires fix of its own, no picture file.
GenerateSettings hires_pass_settings(const GenerateSettings& s, int size_multiple);

// The latent upscalers on latents [n, C, h, w] to [n, C, h2, w2], as torch's
// interpolate without antialiasing: "latent" bilinear (A1111's "Latent"),
// "latent-nearest" nearest (A1111's "Latent (nearest)").
at::Tensor upscale_latents(const at::Tensor& latents, int64_t h2, int64_t w2, const std::string& upscaler);

// The second pass's start. Latent upscalers: the upscaled latents as they are
// (A1111 does not decode them; no posterior draw). lanczos: each first-pass
// image resized to the hires size (image/lanczos.h), then prepared and encoded
// as --init-img takes a picture of the run's size, one moment set per image.
PictureStart hires_start(const GenerateSettings& second, const std::string& upscaler, const ModelConfig& config,
                         const at::Tensor& latents, const std::vector<Image>& images, VaeCodec& vae,
                         const MemoryPlan& plan);

}  // namespace sd
