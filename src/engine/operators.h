// The custom operators exported modules call: sd::attention for the fused
// attention strategy (attention_mode 3) and sd::linear for every Linear layer
// of the UNet (the text encoder's stay nn.Linear; docs/model-format.md).
#pragma once
#include <ATen/core/Tensor.h>

namespace sd {

// softmax(q kᵀ · scale) v for each of `heads` heads: q [B, n, heads * d],
// k and v [B, m, heads * d] -> [B, n, heads * d]. fp32 CPU tensors, and bf16
// ones on a CPU with bf16 instructions (fp32 scores and softmax), take the
// fused kernel (src/kernels/attention_kernel.h); any other dtype or device the
// per-head reference, in fp32 scores as the modules' own paths.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads, double scale);

// The same computed with LibTorch, one head and 256 queries at a time, scores
// in fp32: the fallback, and a check for tests.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                               double scale);

// x wᵀ + b over x's last dimension, w [out, in]. fp32 CPU tensors take
// oneDNN's inner product (src/kernels/linear_kernel.h); anything else, or a
// build without oneDNN, at::linear (for bf16 that is oneDNN's bf16 matmul).
at::Tensor fast_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);

// For --precision bf16 on a CPU (src/kernels/bf16_rows.h): one pass each that
// reads bf16, computes in fp32 and writes bf16. Other dtypes and devices compute
// the same with LibTorch in fp32 and return the input's dtype.
// GEGLU's gate after its projection: with h + bias [..., 2w] (bias optional,
// added in fp32) -> first half * gelu(second half). fp32 CPU tensors (the fused
// fp32 route) take one pass too (src/kernels/f32_rows.h), erf by a polynomial.
at::Tensor geglu(const at::Tensor& h, const c10::optional<at::Tensor>& bias);
// Layer norm over the last dimension.
at::Tensor layer_norm_last(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                           const c10::optional<at::Tensor>& bias, double eps);

// sd::expand_q8: an 8-bit layer's fp32 weight, int8 w times its fp16 scale per
// block of 32 values of a row, in one pass (the products layers.py's _expand states).
at::Tensor expand_q8(const at::Tensor& w, const at::Tensor& scale);
// Group norm of x [batch, channels, ...].
at::Tensor group_norm(const at::Tensor& x, int64_t groups, const c10::optional<at::Tensor>& weight,
                      const c10::optional<at::Tensor>& bias, double eps);

// A 3x3 convolution, stride 1, padding 1 (sd::conv3x3; the 3x3 layers of the
// exported modules call it). bf16 CPU tensors large enough take the bf16 Winograd
// route (src/kernels/winograd_bf16.h) unless set_bf16_winograd(false) (--winograd
// off); everything else at::conv2d, as the modules' own code.
at::Tensor conv3x3(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);
void set_bf16_winograd(bool on);
bool bf16_winograd_enabled();

// A 1x1 convolution, stride 1 (sd::conv1x1; the 1x1 layers of the exported modules
// call it). bf16 CPU tensors take one matmul per image (src/kernels/pointwise_bf16.h)
// where that runs; everything else at::conv2d, as the modules' own code.
at::Tensor conv1x1(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);

// Registers sd::attention, sd::linear and the bf16 row operators with the dispatcher; safe to call more than once.
// The engine calls it before loading a stage (a static registrar in a static
// library would be dropped by the linker).
void register_operators();

}  // namespace sd
