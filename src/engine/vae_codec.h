// Between latents and pixels: the VAE decoder (whole or in tiles), a TAESD in
// its place (--vae-decoder taesd:), the previews (--preview), and the decoder
// output as 8-bit images.
#pragma once
#include <functional>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "engine/loaded_stages.h"
#include "engine/taesd.h"
#include "sd/pipeline.h"

namespace sd {

// Decoder output [n, 3, H, W] in [-1, 1] to 8-bit images, as txt2img does it:
// clamp((x + 1) / 2, 0, 1) * 255, then truncation to uint8.
std::vector<Image> to_images(const at::Tensor& decoded);

// Decodes latents [1, C, h, w] in overlapping tiles of `tile` latent pixels and
// blends them with linear ramps across each overlap, so the peak is that of
// one tile. `factor`: output pixels per latent pixel.
using DecodeFn = std::function<at::Tensor(const at::Tensor&)>;
at::Tensor decode_tiled(const DecodeFn& decode_one, const at::Tensor& z, int tile, int factor);
// The encoder's counterpart: pictures [1, 3, H, W] encoded in the tiles
// decode_tiled would use for their latents (tile latent pixels, `factor`
// pixels each), the moments blended across each overlap. Not exact: each tile
// normalises over itself.
at::Tensor encode_tiled(const DecodeFn& encode_one, const at::Tensor& x, int tile, int factor);

// The posterior sample of the moments, as the UNet's latents: scale_factor *
// (mean + exp(0.5 clamp(logvar, -30, 20)) * randn) with one draw of the mean's
// shape from gen (ldm's DiagonalGaussianDistribution, diffusers' latent_dist.sample).
at::Tensor sample_posterior(const at::Tensor& moments, double scale_factor, at::Generator& gen);

class VaeCodec {
public:
    // Reads and checks --vae-decoder, --preview-decoder, --preview and --vae
    // before anything runs (all of them are small but the VAE).
    VaeCodec(const PipelineOptions& options, LoadedStages& stages);

    // The TAESD that replaces the VAE decoder, if any (the planner counts it).
    const std::optional<TaesdDecoder>& taesd() const { return taesd_; }

    // Latents [n, C, h, w] to decoder output [n, 3, H, W] in [-1, 1], one image
    // at a time (the VAE's activations grow with pixels), in tiles where the plan says.
    at::Tensor decode(const at::Tensor& latents, const MemoryPlan& plan);

    // Pictures [n, 3, H, W] in [-1, 1] to the VAE encoder's moments [n, 2C, h, w]
    // (the mean, then the log-variance), one picture at a time.
    at::Tensor encode(const at::Tensor& images, const MemoryPlan& plan);

    // Where previews go; called by the sampler after each step.
    void set_preview(PreviewFn fn) { preview_ = std::move(fn); }
    bool previews() const { return preview_ != nullptr; }
    void maybe_preview(int step, int total, const at::Tensor& x, const at::Tensor& pred_x0);

private:
    at::Tensor decode_taesd(const TaesdDecoder& t, const at::Tensor& latents, bool winograd = false) const;

    LoadedStages& stages_;
    int preview_every_ = 0;
    std::optional<TaesdDecoder> taesd_, preview_taesd_;
    PreviewFn preview_;
};

}  // namespace sd
