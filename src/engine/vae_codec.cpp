#include "engine/vae_codec.h"

#include <algorithm>

#include "engine/stage_loader.h"
#include "sd/error.h"

namespace sd {

std::vector<Image> to_images(const at::Tensor& decoded) {
    const at::Tensor pixels =
        (255.0 * at::clamp((decoded + 1.0) / 2.0, 0.0, 1.0)).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
    const int64_t H = pixels.size(1), W = pixels.size(2);
    std::vector<Image> images;
    for (int64_t i = 0; i < pixels.size(0); ++i) {
        Image img;
        img.height = static_cast<int>(H);
        img.width = static_cast<int>(W);
        const uint8_t* p = pixels[i].data_ptr<uint8_t>();
        img.rgb.assign(p, p + H * W * 3);
        images.push_back(std::move(img));
    }
    return images;
}

namespace {

// The start of each tile along one side: tiles of `tile` overlapping by
// `overlap`, the last one flush with the end.
std::vector<int64_t> tile_starts(int64_t size, int64_t tile, int64_t overlap) {
    if (size <= tile) return {0};
    std::vector<int64_t> s;
    for (int64_t p = 0;; p += tile - overlap) {
        if (p + tile >= size) {
            s.push_back(size - tile);
            return s;
        }
        s.push_back(p);
    }
}

// A weight of 1 that ramps down over `ramp` pixels on each side meeting another tile.
at::Tensor edge_ramp(int64_t len, double ramp, bool lo, bool hi) {
    const auto i = at::arange(len, at::kFloat);
    auto r = at::ones({len});
    if (lo) r = at::minimum(r, (i + 0.5) / ramp);
    if (hi) r = at::minimum(r, (static_cast<double>(len - 1) - i + 0.5) / ramp);
    return r;
}

}  // namespace

// Each tile normalises over itself (GroupNorm), so tiles differ slightly at
// their edges; the ramps fade one into the next without a seam. The tiles are
// laid out on the latent grid (h x w); the input is in_factor and the output
// out_factor pixels per latent pixel (decode: 1 and 8, encode: 8 and 1).
static at::Tensor run_tiled(const DecodeFn& run_one, const at::Tensor& in, int64_t h, int64_t w, int tile,
                            int64_t in_factor, int64_t factor) {
    const int64_t overlap = std::max<int64_t>(2, tile / 4);
    const auto ys = tile_starts(h, tile, overlap), xs = tile_starts(w, tile, overlap);
    const int64_t th = std::min<int64_t>(tile, h), tw = std::min<int64_t>(tile, w);
    const double ramp = static_cast<double>(overlap * factor);
    at::Tensor out, weight;
    for (size_t yi = 0; yi < ys.size(); ++yi) {
        for (size_t xi = 0; xi < xs.size(); ++xi) {
            const int64_t y = ys[yi], x = xs[xi];
            auto piece = run_one(in.slice(2, y * in_factor, (y + th) * in_factor)
                                     .slice(3, x * in_factor, (x + tw) * in_factor)
                                     .contiguous());
            if (!out.defined()) {
                out = at::zeros({1, piece.size(1), h * factor, w * factor});
                weight = at::zeros({1, 1, h * factor, w * factor});
            }
            auto wy = edge_ramp(th * factor, ramp, yi > 0, yi + 1 < ys.size());
            auto wx = edge_ramp(tw * factor, ramp, xi > 0, xi + 1 < xs.size());
            auto m = (wy.view({-1, 1}) * wx.view({1, -1})).view({1, 1, th * factor, tw * factor});
            auto o = out.slice(2, y * factor, (y + th) * factor).slice(3, x * factor, (x + tw) * factor);
            o.add_(piece * m);
            weight.slice(2, y * factor, (y + th) * factor).slice(3, x * factor, (x + tw) * factor).add_(m);
        }
    }
    return out / weight;
}

at::Tensor decode_tiled(const DecodeFn& decode_one, const at::Tensor& z, int tile, int factor) {
    return run_tiled(decode_one, z, z.size(2), z.size(3), tile, 1, factor);
}

at::Tensor encode_tiled(const DecodeFn& encode_one, const at::Tensor& x, int tile, int factor) {
    return run_tiled(encode_one, x, x.size(2) / factor, x.size(3) / factor, tile, factor, 1);
}

VaeCodec::VaeCodec(const PipelineOptions& o, LoadedStages& stages) : stages_(stages), preview_every_(o.preview_every) {
    if (o.preview_every < 0) throw Error("--preview takes a number of steps, at least 1 (0: no previews)");
    if (!o.vae_decoder.empty()) taesd_ = TaesdDecoder::load(taesd_path_of(o.vae_decoder, "--vae-decoder"));
    if (!o.preview_decoder.empty()) {
        preview_taesd_ = TaesdDecoder::load(taesd_path_of(o.preview_decoder, "--preview-decoder"));
    } else if (o.preview_every > 0) {
        if (!taesd_)
            throw Error(
                "--preview needs a TAESD decoder to draw its previews: give --preview-decoder taesd:FILE "
                "(e.g. taesd_decoder.pth) or --vae-decoder taesd:FILE");
        preview_taesd_ = taesd_;
    }
    if (!o.vae.empty()) {
        if (taesd_)
            throw Error("--vae replaces the weights of the model's VAE, which --vae-decoder " + o.vae_decoder +
                        " does not use; give one of them");
        stages_.set_vae_override(o.vae);
    }
    for (auto* t : {&taesd_, &preview_taesd_})
        if (*t) (*t)->to(stages_.device(), stages_.compute_type());
}

// TAESD takes the UNet's latents as they are and gives [0, 1]; 2x - 1 makes
// it a VAE's output. One image at a time, like the VAE.
at::Tensor VaeCodec::decode_taesd(const TaesdDecoder& t, const at::Tensor& latents, bool winograd) const {
    std::vector<at::Tensor> images;
    for (int64_t i = 0; i < latents.size(0); ++i)
        images.push_back(
            LoadedStages::to_host(t.decode(stages_.to_device(latents.slice(0, i, i + 1)), winograd)) * 2.0 - 1.0);
    return at::cat(images);
}

at::Tensor VaeCodec::decode(const at::Tensor& latents, const MemoryPlan& plan) {
    if (taesd_) return decode_taesd(*taesd_, latents, plan.winograd_levels > 0);
    const ModelConfig& config = stages_.config();
    auto& dec = stages_.vae_decoder();
    set_attention(dec, {plan.attention_mode, plan.attention_chunk});
    set_layer_memory(dec, plan.ff_chunk, plan.conv_split);
    const at::Tensor z = latents * (1.0 / config.scale_factor);
    const DecodeFn decode_one = [&](const at::Tensor& zi) {
        return LoadedStages::to_host(dec.forward({stages_.to_device(zi)}).toTensor());
    };
    std::vector<at::Tensor> images;
    for (int64_t i = 0; i < z.size(0); ++i) {
        auto zi = z.slice(0, i, i + 1);
        images.push_back(plan.vae_tile > 0 ? decode_tiled(decode_one, zi, plan.vae_tile, config.downsample_factor)
                                           : decode_one(zi));
    }
    return at::cat(images);
}

at::Tensor sample_posterior(const at::Tensor& moments, double scale_factor, at::Generator& gen) {
    const auto parts = moments.chunk(2, 1);
    const at::Tensor std = at::exp(0.5 * at::clamp(parts[1], -30.0, 20.0));
    return (parts[0] + std * at::randn(parts[0].sizes(), gen)) * scale_factor;
}

at::Tensor VaeCodec::encode(const at::Tensor& images, const MemoryPlan& plan) {
    auto& enc = stages_.vae_encoder();
    set_attention(enc, {plan.attention_mode, plan.attention_chunk});
    set_layer_memory(enc, plan.ff_chunk, plan.conv_split);
    const DecodeFn encode_one = [&](const at::Tensor& xi) {
        return LoadedStages::to_host(enc.forward({stages_.to_device(xi)}).toTensor());
    };
    const int f = stages_.config().downsample_factor;
    std::vector<at::Tensor> moments;
    for (int64_t i = 0; i < images.size(0); ++i) {
        const at::Tensor xi = images.slice(0, i, i + 1);
        // Tiled where the decoder would be: the same tiles on the latent grid.
        const bool tiled = plan.vae_tile > 0 && (xi.size(2) / f > plan.vae_tile || xi.size(3) / f > plan.vae_tile);
        moments.push_back(tiled ? encode_tiled(encode_one, xi, plan.vae_tile, f) : encode_one(xi));
    }
    return at::cat(moments);
}

// Previews of the current predicted images every preview_every steps.
void VaeCodec::maybe_preview(int step, int total, const at::Tensor& x, const at::Tensor& pred_x0) {
    if (!preview_ || preview_every_ <= 0 || !preview_taesd_ || (step + 1) % preview_every_ != 0) return;
    const at::Tensor decoded = decode_taesd(*preview_taesd_, pred_x0.defined() ? pred_x0 : x);
    preview_(step + 1, total, to_images(decoded));
}

}  // namespace sd
