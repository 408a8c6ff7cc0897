// How many FLOP a core gets per second from one instruction kind, on independent
// accumulator chains (enough of them to hide the latency): fp32 FMA on zmm and ymm,
// and avx512_bf16's dot product of bf16 pairs into fp32. It tells whether bf16
// without AMX can beat fp32 at all on this CPU: oneDNN cannot beat the instruction.
#include <immintrin.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

namespace {

constexpr long kInstructions = 4'000'000'000L;  // per thread: about a second

template <int Chains>
__attribute__((target("avx512f"))) float fma_zmm() {
    __m512 acc[Chains];
    const __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
    for (int i = 0; i < Chains; ++i) acc[i] = _mm512_set1_ps(float(i));
    for (long n = 0; n < kInstructions / Chains; ++n)
#pragma GCC unroll 32
        for (int i = 0; i < Chains; ++i) acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
    __m512 s = acc[0];
    for (int i = 1; i < Chains; ++i) s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

template <int Chains>
__attribute__((target("avx2,fma"))) float fma_ymm() {
    __m256 acc[Chains];
    const __m256 x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
    for (int i = 0; i < Chains; ++i) acc[i] = _mm256_set1_ps(float(i));
    for (long n = 0; n < kInstructions / Chains; ++n)
#pragma GCC unroll 32
        for (int i = 0; i < Chains; ++i) acc[i] = _mm256_fmadd_ps(x, y, acc[i]);
    __m256 s = acc[0];
    for (int i = 1; i < Chains; ++i) s = _mm256_add_ps(s, acc[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

template <int Chains>
__attribute__((target("avx512f,avx512bf16"))) float dot_bf16_zmm() {
    __m512 acc[Chains];
    const __m512bh one = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
    for (int i = 0; i < Chains; ++i) acc[i] = _mm512_set1_ps(float(i));
    for (long n = 0; n < kInstructions / Chains; ++n)
#pragma GCC unroll 32
        for (int i = 0; i < Chains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], one, one);
    __m512 s = acc[0];
    for (int i = 1; i < Chains; ++i) s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

double thread_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Rates per thread by the thread's own CPU time, so another process on the
// machine slows the wall clock but not the figure (frequency aside).
void report(const char* name, float (*kernel)(), double flop_per_instruction, int threads) {
    std::vector<std::thread> pool;
    std::vector<float> sink(threads);
    std::vector<double> cpu(threads);
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            const double start = thread_seconds();
            sink[t] = kernel();
            cpu[t] = thread_seconds() - start;
        });
    for (auto& t : pool) t.join();
    double s = 0;
    for (double c : cpu) s += c / threads;
    const double per_core = double(kInstructions / 1e9) / s;  // each thread ran the same count
    std::printf("%-34s %d thread(s): %5.2f G instr/s a thread, %6.1f GFLOP/s a thread, %6.1f in all (by CPU time)\n", name, threads,
                per_core, per_core * flop_per_instruction, per_core * flop_per_instruction * threads);
}

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
    if (!__builtin_cpu_supports("avx512f")) {
        report("vfmadd231ps ymm, 12 chains (fp32)", fma_ymm<12>, 16, threads);
        std::puts("no avx512f: the zmm and avx512_bf16 rows are skipped");
        return 0;
    }
    report("vfmadd231ps zmm, 12 chains (fp32)", fma_zmm<12>, 32, threads);
    report("vfmadd231ps zmm, 24 chains (fp32)", fma_zmm<24>, 32, threads);
    report("vfmadd231ps ymm, 12 chains (fp32)", fma_ymm<12>, 16, threads);
    if (!__builtin_cpu_supports("avx512bf16")) {
        std::puts("no avx512_bf16: its rows are skipped");
        return 0;
    }
    report("vdpbf16ps zmm, 12 chains (bf16)", dot_bf16_zmm<12>, 64, threads);
    report("vdpbf16ps zmm, 24 chains (bf16)", dot_bf16_zmm<24>, 64, threads);
    return 0;
}
