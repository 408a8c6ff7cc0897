#include "kernels/attention_kernel.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/attention_tiles.h"
#include "kernels/linear_kernel.h"

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
SD_DECLARE_ISA(amx)
SD_DECLARE_ISA(avx512bf16)
#undef SD_DECLARE_ISA

int64_t padded_keys(int64_t m) { return (m + kKeyAlign - 1) / kKeyAlign * kKeyAlign; }
int64_t padded_width(int64_t d) { return (d + kWidthAlign - 1) / kWidthAlign * kWidthAlign; }

// Room for the bf16 builds' pack too (channels padded to 32, in halves):
// 32-rounded d + padded width <= 2 (max(d, 16) + padded width).
int64_t packed_head_floats(const AttentionProblem& p) {
    return padded_keys(p.m) * (std::max<int64_t>(p.d, 16) + padded_width(p.d));
}

int64_t packed_floats(const AttentionProblem& p) { return p.batch * p.heads * packed_head_floats(p); }

int64_t attention_tasks(const AttentionProblem& p) { return p.batch * p.heads * ((p.n + kQueryTile - 1) / kQueryTile); }

namespace {

const AttentionKernel kKernels[] = {{"avx512", avx512::pack, avx512::attend},
                                    {"avx2", avx2::pack, avx2::attend},
                                    {"baseline", baseline::pack, baseline::attend},
                                    {"amx", amx::pack, amx::attend},
                                    {"avx512bf16", avx512bf16::pack, avx512bf16::attend}};
constexpr int kKernelCount = 5;
// For bf16 problems only (fp32 ones keep the others' results): both products in bf16.
constexpr int kAmxKernel = 3;
constexpr int kDotKernel = 4;  // avx512_bf16's dot product, where there is no AMX

#if defined(__x86_64__)
// AMX as oneDNN sees it (DNNL_MAX_CPU_ISA can hide it), and Linux's leave to
// use its tile state in this process (asked for once; oneDNN asks too).
bool amx_usable() {
    static const bool ok = [] {
        if (!cpu_has_amx() || !__builtin_cpu_supports("avx512bw")) return false;
        constexpr long kReqPerm = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        return syscall(SYS_arch_prctl, kReqPerm, kTileData) == 0;
    }();
    return ok;
}
#endif

bool cpu_runs(int i) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    // The AVX-512 build is compiled with -mavx512dq -mavx512vl as well.
    if (i == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
    if (i == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (i == kAmxKernel) return cpu_runs(0) && amx_usable();
    // bf16 as oneDNN sees it, so that DNNL_MAX_CPU_ISA's stand-ins hide it here too.
    if (i == kDotKernel)
        return cpu_runs(0) && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16") &&
               cpu_has_bf16();
    return true;
#else
    return i >= 0;  // all five are the portable build
#endif
}

}  // namespace

const AttentionKernel* attention_kernel_named(const char* name) {
    for (int i = 0; i < kKernelCount; ++i)
        if (std::strcmp(name, kKernels[i].name) == 0) return cpu_runs(i) ? &kKernels[i] : nullptr;
    return nullptr;
}

std::string attention_isa_problem() {
    const char* want = std::getenv("SD_ATTENTION_ISA");
    if (!want || !*want) return "";
    for (const auto& k : kKernels)
        if (std::strcmp(want, k.name) == 0) return "";
    return std::string("SD_ATTENTION_ISA=") + want +
           " names no attention kernel (it takes avx512, avx2, baseline, amx or avx512bf16)";
}

const AttentionKernel& attention_kernel() {
    static const AttentionKernel* chosen = [] {
        const char* want = std::getenv("SD_ATTENTION_ISA");
        if (want && *want) {
            if (const AttentionKernel* k = attention_kernel_named(want)) return k;
            // Unknown names were refused before the run (attention_isa_problem); one this CPU lacks: go on.
            std::fprintf(stderr,
                         "sd-txt2img: warning: SD_ATTENTION_ISA=%s: this CPU cannot run that kernel; using "
                         "the widest it runs\n",
                         want);
        }
        for (int i = 0; i < 3; ++i)
            if (cpu_runs(i)) return &kKernels[i];
        return &kKernels[2];
    }();
    return *chosen;
}

const AttentionKernel& attention_kernel_bf16() {
    static const AttentionKernel* chosen = [] {
        const char* want = std::getenv("SD_ATTENTION_ISA");
        if (!want || !*want)
            for (int i : {kAmxKernel, kDotKernel})
                if (cpu_runs(i)) return &kKernels[i];
        return &attention_kernel();
    }();
    return *chosen;
}

}  // namespace sd::kernels
