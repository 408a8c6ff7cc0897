// Tensors from the files users download beside a model: .safetensors, and
// torch.save zip archives (.pt, .pth, .ckpt, .bin) read without running their
// pickle (src/io/torch_pickle.h). LoRAs, embeddings, TAESD and VAE files come
// through here.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace sd {

// Every tensor of the file, named by its path of dict keys joined with '.'
// ("string_to_param.*", "state_dict.decoder.conv_in.weight"), copied into
// memory in the file's dtype. Throws sd::Error with one line naming the file:
// missing, truncated, a TorchScript archive, the pre-1.6 torch.save format, a
// pickle that needs anything but tensors in dicts and lists.
std::vector<std::pair<std::string, at::Tensor>> read_tensor_file(const std::string& path);

}  // namespace sd
