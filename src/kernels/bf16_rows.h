// Row kernels on bf16 activations for --precision bf16 on a CPU: GEGLU's gate
// and the two norms, each in one pass that reads bf16, computes in fp32 and
// writes bf16. LibTorch 1.13 runs them as several passes instead (a widening
// copy, the op, a narrowing copy; GEGLU's gelu on a strided half of a chunk).
// Plain C++ without LibTorch; each is built for AVX-512, AVX2 and the
// baseline, picked at run time (GCC target clones). Raw bfloat16 bits.
#pragma once
#include <cstdint>

namespace sd::kernels {

// out[r][c] = a * gelu(g) with a = in[r][c] + bias[c], g = in[r][width + c] +
// bias[width + c] for rows [begin, end): in is [rows, 2 * width], out [rows,
// width], both dense; bias (fp32, 2 * width) may be null. gelu is the erf form.
void geglu_bf16(const uint16_t* in, const float* bias, uint16_t* out, int64_t width, int64_t begin, int64_t end);

// Layer norm over each row of `width` values, rows [begin, end), with fp32
// weight and bias (either may be null: 1 and 0).
void layer_norm_bf16(const uint16_t* in, uint16_t* out, int64_t width, const float* weight, const float* bias,
                     float eps, int64_t begin, int64_t end);

// Group norm of x [batch, channels, spatial] (dense): blocks [begin, end) of
// batch * groups, each `channels / groups` channels of `spatial` values.
void group_norm_bf16(const uint16_t* in, uint16_t* out, int64_t channels, int64_t spatial, int64_t groups,
                     const float* weight, const float* bias, float eps, int64_t begin, int64_t end);

}  // namespace sd::kernels
