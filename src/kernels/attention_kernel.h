// Fused attention on fp32 (or bf16) CPU tensors: softmax(q kᵀ · scale) v per head, in
// tiles of queries against tiles of keys with a running (online) softmax, so
// no score matrix larger than one tile ever exists. Plain C++ without
// LibTorch: attention_kernel_isa.cpp is compiled once per instruction set
// (AVX-512, AVX2+FMA, baseline) and the caller picks one at run time.
#pragma once
#include <cstdint>
#include <string>

namespace sd::kernels {

// Element (b, i, h * d + c) of q lives at q[b * q_batch + i * q_row + h * d + c]
// (the layout of the q/k/v projections: heads side by side in each row), and
// likewise for k, v and out.
struct AttentionProblem {
    int64_t batch = 0, heads = 0, n = 0, m = 0, d = 0;  // n queries, m keys, d = head width
    const float* q = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
    float* out = nullptr;
    int64_t q_batch = 0, q_row = 0, k_batch = 0, k_row = 0, v_batch = 0, v_row = 0, o_batch = 0, o_row = 0;
    float scale = 1.0f;
    // bf16 inputs and output instead (raw bfloat16 bits, same strides): where
    // set, they are read and written in place of q, k, v and out. Scores,
    // softmax and sums stay fp32; the kernel widens k and v as it packs them.
    const uint16_t* q_bf16 = nullptr;
    const uint16_t* k_bf16 = nullptr;
    const uint16_t* v_bf16 = nullptr;
    uint16_t* out_bf16 = nullptr;
    // Scratch the caller allocates with packed_floats(): kᵀ and v of every
    // (batch, head), padded, in the order the tile loops read them.
    float* packed = nullptr;
};

// Key count and head width after padding, and the scratch size in floats.
int64_t padded_keys(int64_t m);
int64_t padded_width(int64_t d);
int64_t packed_floats(const AttentionProblem& p);
// One (batch, head)'s share of it: kᵀ in key panels, then v with padded rows.
int64_t packed_head_floats(const AttentionProblem& p);

// Work split for a thread pool: pack (batch, head) pairs [begin, end) of
// batch * heads, then attend tasks [begin, end) of attention_tasks(p).
int64_t attention_tasks(const AttentionProblem& p);

struct AttentionKernel {
    const char* name;
    void (*pack)(const AttentionProblem&, int64_t begin, int64_t end);
    void (*attend)(const AttentionProblem&, int64_t begin, int64_t end);
};

// The widest kernel this CPU runs (SD_ATTENTION_ISA=avx512|avx2|baseline
// picks one for tests and benchmarks; one the CPU lacks: a warning, then the widest).
const AttentionKernel& attention_kernel();

// For bf16 problems, where SD_ATTENTION_ISA names none: both products in bf16, on
// AMX tiles ("amx") where the CPU has AMX as oneDNN sees it, else on avx512_bf16's
// dot product ("avx512bf16") where it has that; else attention_kernel().
const AttentionKernel& attention_kernel_bf16();

// The kernel of that name ("avx512", "avx2", "baseline", "amx", "avx512bf16"), or nullptr when
// this CPU cannot run it.
const AttentionKernel* attention_kernel_named(const char* name);

// "" when SD_ATTENTION_ISA is unset, empty or a kernel's name; else the one line refusing it.
std::string attention_isa_problem();

}  // namespace sd::kernels
