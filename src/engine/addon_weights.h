// Reading the weights of add-on files given at run time (a TAESD decoder, a
// standalone VAE): the tensors of the file it needs, by name, floats widened to fp32.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "engine/tensor_file.h"

namespace sd {

// A .safetensors file, or a torch.save archive (.pth/.pt/.ckpt/.bin) read by
// the restricted reader (no code runs). Only the tensors whose names `wanted`
// accepts are read (a full checkpoint given to --vae costs its VAE, not its
// UNet); floating ones come back as fp32, any other as stored, for the caller
// to refuse by name. `what` names the file's role in messages ("--vae");
// max_bytes bounds the memory of the read (io/tensor_reader.h). Throws sd::Error.
NamedTensors read_addon_weights(const std::string& path, const std::string& what, uint64_t max_bytes,
                                const std::function<bool(const std::string&)>& wanted);

// "has dtype I64, expected a float type" when the tensor is not a float, else "".
std::string float_dtype_problem(const at::Tensor& t);

// "holds NaN or infinite values" when a float tensor does, else "": such a weight makes
// NaN or black pictures with no other sign.
std::string non_finite_problem(const at::Tensor& t);

}  // namespace sd
