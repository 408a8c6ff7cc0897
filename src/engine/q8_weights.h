// 8-bit weights (--weights q8): a layer's weight held as int8 with one fp16 scale
// per block of 32 values along each output row, GGUF's q8_0 blocks. The exported
// Linear and Conv2d layers (python/sd_export/modules/layers.py `_expand`) expand it
// into a fresh fp32 tensor as they run, as fp16 weights are widened.
#pragma once
#include <torch/script.h>

namespace sd {

// Narrows every Linear and Conv2d weight of m whose output rows are whole blocks of 32
// to int8 + fp16 scales, quantized as ggml's quantize_row_q8_0 does (d = max|x| / 127
// as fp16, q = round(x / d)), one layer at a time (each layer's file pages are handed
// back as it is replaced). Every other floating-point parameter is held as fp32.
// Returns the count narrowed. Throws sd::Error when m's code has no 8-bit layers (an
// export made before them) or a weight holds NaN or infinite values.
int narrow_to_q8(torch::jit::Module& m, const std::string& path);

// Expands every 8-bit layer of m (a --dtype q8_0 export's, as mapped) into an fp32 weight,
// scale * q as the layer itself would (python/sd_export/modules/layers.py `_expand`), one
// layer at a time, for runs that hold another type (--weights fp32|fp16, --precision bf16)
// or merge a LoRA. Returns the count expanded (0 for a float file).
int expand_q8(torch::jit::Module& m);

// The q8_0 blocks of a float tensor whose rows are whole blocks: {int8 values in the
// tensor's shape, fp16 scales [rows, row / 32]}. A block whose scale is not a normal float
// (max|x| below ~1.5e-36) is all zeros with d = 0. Throws sd::Error("holds NaN or infinite
// values") for a tensor that does.
std::pair<at::Tensor, at::Tensor> quantize_q8_0(const at::Tensor& w);

}  // namespace sd
