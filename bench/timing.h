// Timing for the C++ benchmarks: the best of `repeats` runs after `warmups`
// untimed ones (the first calls make primitives, fault pages in and fill caches).
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>

inline double best_seconds(const std::function<void()>& fn, int repeats, int warmups = 1) {
    for (int w = 0; w < warmups; ++w) fn();
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}
