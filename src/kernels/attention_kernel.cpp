#include "kernels/attention_kernel.h"

#include <cstdlib>
#include <cstring>

#include "kernels/attention_tiles.h"

namespace sd::kernels {

// Each instruction-set build of attention_kernel_isa.cpp defines these.
#define SD_DECLARE_ISA(ns)                                  \
    namespace ns {                                          \
    void pack(const AttentionProblem&, int64_t, int64_t);   \
    void attend(const AttentionProblem&, int64_t, int64_t); \
    }
SD_DECLARE_ISA(avx512)
SD_DECLARE_ISA(avx2)
SD_DECLARE_ISA(baseline)
SD_DECLARE_ISA(avx512bf16)
#undef SD_DECLARE_ISA

int64_t padded_keys(int64_t m) { return (m + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }
int64_t padded_width(int64_t d) { return (d + kWidthAlign - 1) / kWidthAlign * kWidthAlign; }

int64_t packed_head_floats(const AttentionProblem& p) { return padded_keys(p.m) * (p.d + padded_width(p.d)); }

int64_t packed_floats(const AttentionProblem& p) { return p.batch * p.heads * packed_head_floats(p); }

int64_t attention_tasks(const AttentionProblem& p) { return p.batch * p.heads * ((p.n + kQueryTile - 1) / kQueryTile); }

namespace {

const AttentionKernel kKernels[] = {{"avx512", avx512::pack, avx512::attend},
                                    {"avx2", avx2::pack, avx2::attend},
                                    {"baseline", baseline::pack, baseline::attend},
                                    {"avx512bf16", avx512bf16::pack, avx512bf16::attend}};
constexpr int kKernelCount = 4;
constexpr int kBf16Kernel = 3;  // picked by name only (SD_ATTENTION_ISA)

bool cpu_runs(int i) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    // The AVX-512 build is compiled with -mavx512dq -mavx512vl as well.
    if (i == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
    if (i == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (i == kBf16Kernel)
        return cpu_runs(0) && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
    return true;
#else
    return i >= 0;  // all three are the portable build
#endif
}

}  // namespace

const AttentionKernel* attention_kernel_named(const char* name) {
    for (int i = 0; i < kKernelCount; ++i)
        if (std::strcmp(name, kKernels[i].name) == 0) return cpu_runs(i) ? &kKernels[i] : nullptr;
    return nullptr;
}

const AttentionKernel& attention_kernel() {
    static const AttentionKernel* chosen = [] {
        const char* want = std::getenv("SD_ATTENTION_ISA");
        if (want)
            if (const AttentionKernel* k = attention_kernel_named(want)) return k;
        for (int i = 0; i < 3; ++i)
            if (cpu_runs(i)) return &kKernels[i];
        return &kKernels[2];
    }();
    return *chosen;
}

const AttentionKernel& attention_kernel_bf16() {
    static const AttentionKernel* chosen = [] {
        // Not the default yet: its bf16 dot products measured 1.4-1.6x slower than the
        // widening AVX-512 build on this round's Xeon (one port runs them, two the FMAs).
        return &attention_kernel();
    }();
    return *chosen;
}

}  // namespace sd::kernels
