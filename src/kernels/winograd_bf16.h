// A bf16 3x3 convolution (stride 1, padding 1) by Winograd F(2x2, 3x3), without
// LibTorch. oneDNN 2.6 has no bf16 Winograd convolution, so bf16 convolutions
// do all 36 multiplications of a 2x2 output tile where this does 16: the
// transforms run in fp32, the 16 products as bf16 GEMMs with fp32 sums
// (oneDNN's matmul), on plain NCHW activations. docs/benchmarks.md, issue 34.
#pragma once
#include <cstdint>

namespace sd::kernels {

// Whether the route runs here at all: avx512_bf16 without AMX, and oneDNN in this build.
bool winograd_bf16_available();
// Whether the route runs a convolution of n images of ic channels, h x w, to oc
// channels here: where available (as oneDNN sees the CPU: an AMX CPU under
// DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 counts), even h and w, and a problem large
// enough to gain (16x16 pixels and more: SD 1.5's three upper UNet levels at 512²;
// 64 channels and more: not the first and last layers).
bool winograd_bf16_runs(int64_t n, int64_t ic, int64_t oc, int64_t h, int64_t w);

// The most scratch a call holds beside its input and output, for a weight of
// `weight_values` values (oc x ic x 9). It is kept for the next call until
// winograd_bf16_release (the planner counts it with the UNet's weights).
int64_t winograd_bf16_scratch_bytes(int64_t weight_values);
void winograd_bf16_release();

// y [n][oc][h][w] = conv3x3(x [n][ic][h][w], weight [oc][ic][3][3], padding 1) + bias
// ([oc] or null), all dense bf16 (the bits as uint16). Even h and w, on a CPU with
// avx512_bf16 (AMX or not). Runs on the calling thread's OpenMP thread count. False where oneDNN refused the
// products (y is then unwritten).
bool winograd_bf16_conv3x3(const uint16_t* x, int64_t n, int64_t ic, int64_t h, int64_t w, const uint16_t* weight,
                           int64_t oc, const uint16_t* bias, uint16_t* y);

}  // namespace sd::kernels
