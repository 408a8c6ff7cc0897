// y = x wᵀ + b on fp32 CPU arrays through oneDNN's inner product, without
// LibTorch. LibTorch 1.13 sends Linear layers to OpenBLAS here, which runs
// the UNet's shapes (a few hundred to a few thousand rows, 320-5120 wide) at
// 90-145 GFLOP/s on 2 threads; oneDNN's (the library LibTorch's own
// convolutions use) runs them at 300-440 (docs/benchmarks.md, issue 21).
#pragma once
#include <cstdint>

namespace sd::kernels {

// x [rows, in] and w [out, in] dense row-major, bias [out] or nullptr,
// y [rows, out]. Runs on the calling thread's OpenMP thread count.
// Returns false when this build has no oneDNN or oneDNN refused the shape;
// the caller then computes it another way.
bool linear_f32(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, const float* bias, float* y);

// Whether linear_f32 can run at all (built with oneDNN).
bool linear_kernel_available();

// Whether this CPU has bf16 instructions oneDNN uses (avx512_bf16 or AMX),
// as oneDNN sees it: DNNL_MAX_CPU_ISA below AVX512_CORE_BF16 says no.
bool cpu_has_bf16();
// Whether oneDNN may use AMX tiles here (AMX-BF16 present and allowed).
bool cpu_has_amx();
// Whether bf16 products without AMX outrun fp32 here: avx512_bf16's dot product gives
// twice fp32 FMA's FLOPs on AMD's Zen 4 and under half on Intel's Xeon (bench/isa_peak.cpp).
bool cpu_bf16_dot_outruns_fp32();

}  // namespace sd::kernels
