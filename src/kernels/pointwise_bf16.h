// A bf16 1x1 convolution (stride 1) as one product per image: y [oc][hw] =
// w [oc][ic] x [ic][hw] on the plain NCHW activations, through oneDNN's matmul with
// fp32 sums. LibTorch sends such a layer to oneDNN's convolution, which reorders the
// activations into its blocked layout and back on every call: the VAE's 1x1 layers at
// 256² and 512² ran at 90-160 GFLOP/s that way, the product at 320-430. docs/benchmarks.md, issue 34.
#pragma once
#include <cstdint>

namespace sd::kernels {

// Whether pointwise_bf16 runs here: as winograd_bf16_available (avx512_bf16 without AMX).
bool pointwise_bf16_available();

// The fp32 sums pointwise_bf16 keeps for a calling thread where it runs here (0
// elsewhere): at most 16 MiB for layers of up to 16384 output channels.
int64_t pointwise_bf16_scratch_bytes();

// The pixels one product takes for a layer of oc output channels on hw pixels: its
// fp32 sums (oc times that) are what the calling thread keeps.
int64_t pointwise_bf16_chunk_columns(int64_t oc, int64_t hw);

// y [n][oc][hw] = w [oc][ic] x [n][ic][hw] + bias ([oc] or null), all dense bf16 (the
// bits as uint16), the bias added to the fp32 sums before the one rounding. Runs on the
// calling thread's OpenMP thread count, and keeps up to 16 MiB of fp32 sums for the
// calling thread's next call. False where it does not run here or oneDNN refused the
// shape (y is then unwritten).
bool pointwise_bf16(const uint16_t* x, int64_t n, int64_t ic, int64_t hw, const uint16_t* w, int64_t oc,
                    const uint16_t* bias, uint16_t* y);

}  // namespace sd::kernels
