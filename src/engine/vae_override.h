// --vae FILE: a standalone VAE (e.g. vae-ft-mse-840000-ema-pruned) whose
// decoder weights replace those of the model's vae_decoder.weights.
#pragma once
#include <map>
#include <string>

#include <ATen/ATen.h>

namespace sd {

// The decoder tensors of the VAE file, named as in vae_decoder.weights
// ("decoder.*", "post_quant_conv.*"; in the file bare or under
// "first_stage_model.", encoder tensors ignored), each checked against the
// model's VAE weight file `model_weights` by name and shape. Throws sd::Error
// with one line naming the first key that is missing or does not fit.
std::map<std::string, at::Tensor> read_vae_override(const std::string& path, const std::string& model_weights);

}  // namespace sd
