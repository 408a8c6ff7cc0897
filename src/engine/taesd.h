// TAESD (madebyollin's tiny autoencoder), decoder only: UNet latents to an
// image in a fraction of the full VAE's time and memory. The sd-txt2img tool
// makes images from text, so the encoder is not needed.
//
// The decoder is a fixed stack of 3x3 convolutions, ReLUs, residual blocks and
// nearest-neighbour upsampling; it is built here from its weights with ATen
// calls instead of an exported TorchScript module, so the downloadable files
// (taesd_decoder.pth / .safetensors, a diffusers AutoencoderTiny folder) work
// as they are, with nothing to export and no model code to check.
#pragma once
#include <map>
#include <string>

#include <ATen/ATen.h>

namespace sd {

class TaesdDecoder {
public:
    // FILE (madebyollin's taesd_decoder.pth or .safetensors, keys "{i}.*") or a
    // diffusers AutoencoderTiny folder (diffusion_pytorch_model.safetensors,
    // keys "decoder.layers.{i-1}.*"). Every expected tensor is checked by
    // name and shape; the channel count comes from the weights. Throws sd::Error
    // with one line naming the file and the key.
    static TaesdDecoder load(const std::string& path);

    // UNet latents as they are (TAESD is trained on them: no 1/scale_factor),
    // [n, 4, h, w] -> RGB [n, 3, 8h, 8w] in [0, 1] nominal.
    // winograd: fp32 on a CPU with Winograd convolutions (blocked_operators.h) runs
    // the C-channel layers on blocked activations by Winograd (the plan's choice).
    at::Tensor decode(const at::Tensor& latents, bool winograd = false) const;

    // Moves the weights (kept fp32 on the CPU after loading).
    void to(c10::Device device, at::ScalarType dtype);

    int channels() const { return channels_; }
    double weight_bytes() const;

private:
    const at::Tensor& w(const std::string& key) const { return weights_.at(key); }
    at::Tensor block(const at::Tensor& x, int layer) const;
    at::Tensor decode_blocked(const at::Tensor& latents) const;

    std::map<std::string, at::Tensor> weights_;  // madebyollin's names
    int channels_ = 0;
    bool channels_last_ = false;  // bf16 on a CPU (to())
};

// "taesd:PATH" -> PATH; throws sd::Error naming `flag` for anything else.
std::string taesd_path_of(const std::string& spec, const std::string& flag);

}  // namespace sd
