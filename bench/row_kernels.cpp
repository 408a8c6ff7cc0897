// The fp32 row kernels (src/kernels/f32_rows.h), each instruction-set build this CPU
// runs, on one thread: GEGLU's gate over SD 1.5's first-level shape (4096 tokens,
// 1280 channels), best of 5, nanoseconds per output value.
//
//   cmake --build build --target bench_row_kernels && build/bench_row_kernels
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/f32_rows.h"

int main() {
    const int64_t rows = 4096, width = 1280;
    std::vector<float> in(static_cast<size_t>(rows * 2 * width)), out(static_cast<size_t>(rows * width));
    std::vector<float> bias(static_cast<size_t>(2 * width), 0.01f);
    std::mt19937 gen(1);
    std::normal_distribution<float> normal;
    for (auto& v : in) v = normal(gen);
    for (const char* name : {"avx512", "avx2", "baseline"}) {
        const auto* k = sd::kernels::f32_row_kernels_named(name);
        if (!k) {
            std::printf("%-8s not run by this CPU\n", name);
            continue;
        }
        double best = 1e9;
        for (int rep = 0; rep < 5; ++rep) {
            const auto start = std::chrono::steady_clock::now();
            k->geglu(in.data(), bias.data(), out.data(), width, 0, rows);
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        std::printf("%-8s geglu [%lld, %lld]: %6.1f ms, %.2f ns a value\n", name, static_cast<long long>(rows),
                    static_cast<long long>(width), best * 1e3, best * 1e9 / static_cast<double>(rows * width));
    }
}
