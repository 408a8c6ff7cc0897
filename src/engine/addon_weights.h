// Reading the weights of add-on files given at run time (a TAESD decoder, a
// standalone VAE): every tensor of the file, by name, widened to fp32.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace sd {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A .safetensors file, or a torch.save archive (.pth/.pt/.ckpt/.bin) read by
// the restricted reader (no code runs). Floating tensors come back as fp32;
// `what` names the file's role in messages ("--vae"). Throws sd::Error.
NamedTensors read_addon_weights(const std::string& path, const std::string& what);

}  // namespace sd
