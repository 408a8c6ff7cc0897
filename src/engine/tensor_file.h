// Tensors from the files users download beside a model: .safetensors, and
// torch.save zip archives (.pt, .pth, .ckpt, .bin) read without running their
// pickle. The file is read by src/io/tensor_reader.h (no LibTorch); this part
// turns its bytes into tensors. LoRAs, embeddings, TAESD and VAE files come
// through here.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "io/tensor_reader.h"

namespace sd {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The file's tensors that `keep` chooses (by entry; null: all), in the file's
// dtype and order, from the one open file. Throws sd::Error with one line
// naming the file (io/tensor_reader.h), also when memory runs out.
NamedTensors read_tensors(TensorReader& file, const std::function<bool(const TensorEntry&)>& keep = nullptr);

// Every tensor of the file, named by its path of dict keys joined with '.'
// ("string_to_param.*", "state_dict.decoder.conv_in.weight"), copied into
// memory in the file's dtype. Throws sd::Error with one line naming the file:
// missing, truncated, a TorchScript archive, the pre-1.6 torch.save format, a
// pickle that needs anything but tensors in dicts and lists, more memory than
// options.max_bytes.
NamedTensors read_tensor_file(const std::string& path, const TensorReadOptions& options = {"tensor file"});

// The at::ScalarType of a safetensors dtype name ("F32", "I64", ...).
at::ScalarType scalar_type_of(const std::string& dtype);

}  // namespace sd
