// Row kernels on fp32 activations for the fused fp32 route (python/sd_export/
// modules/unet.py GEGLU `fused_rows`): GEGLU's gate in one pass that reads the
// projection once and writes the result, where LibTorch runs gelu on a strided
// half of a chunk (several times slower than on a dense tensor) and a multiply.
// Plain C++ without LibTorch, built for AVX-512, AVX2 and the baseline; the
// widest the CPU runs is picked at run time, or the one SD_ATTENTION_ISA names
// (avx512, avx2, baseline; amx means avx512), as for the attention kernel.
#pragma once
#include <cstdint>

namespace sd::kernels {

struct F32RowKernels {
    const char* name;
    // out[r][c] = a * gelu(g) with a = in[r][c] + bias[c], g = in[r][width + c] +
    // bias[width + c] for rows [begin, end): in is [rows, 2 * width], out [rows,
    // width], both dense; bias (2 * width) may be null. gelu is the erf form.
    void (*geglu)(const float* in, const float* bias, float* out, int64_t width, int64_t begin, int64_t end);
};

// The build named (avx512, avx2, baseline), or null if unknown or this CPU cannot run it.
const F32RowKernels* f32_row_kernels_named(const char* name);
// The one in use: SD_ATTENTION_ISA's if set and runnable, else the widest.
const F32RowKernels& f32_row_kernels();

}  // namespace sd::kernels
