// Vector arithmetic shared by the row kernels (bf16_rows.cpp, f32_rows.cpp):
// 16-float GCC vectors (the bf16 kernels' width, one AVX-512 register), and the
// exp and gelu both kernels compute with, at any width. Include only from those
// files: every function is inlined into a caller built per ISA.
#pragma once
#include <cstdint>

#pragma GCC diagnostic ignored "-Wpsabi"

#define SD_INLINE inline __attribute__((always_inline))

namespace sd::kernels::rows {

constexpr int W = 16;
typedef float Vec __attribute__((vector_size(W * 4)));
typedef int32_t IVec __attribute__((vector_size(W * 4)));
typedef float UnalignedVec __attribute__((vector_size(W * 4), aligned(4), may_alias));

// The arithmetic below takes a float vector of any width V (its masks are
// decltype(V{} < V{})): the row kernels' 16 floats, and f32_rows.cpp's builds for
// 16-register instruction sets their own width, as GCC 12 lowers a comparison
// of 16 floats element by element where the widest vector holds 8.
template <class V>
SD_INLINE V splat(float x) {
    return x - V{};
}

template <class V, class M>
SD_INLINE V select(M mask, V a, V b) {
    const M r = (mask & reinterpret_cast<const M&>(a)) | (~mask & reinterpret_cast<const M&>(b));
    return reinterpret_cast<const V&>(r);
}

// e^x for x <= 0: x = n ln2 + r, a degree-6 polynomial in r, 2^n in the exponent bits.
template <class V>
SD_INLINE V exp_nonpositive(V x) {
    using M = decltype(x < x);
    x = select(x < -87.0f, splat<V>(-87.0f), x);
    const V t = x * 1.44269504088896341f - 0.5f;
    M n = __builtin_convertvector(t, M);  // toward zero: ceil(t) for t < 0, round(x log2 e)
    const V nf = __builtin_convertvector(n, V);
    const V r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
    V p = splat<V>(1.0f / 720);
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const M bits = (n + 127) << 23;
    return p * reinterpret_cast<const V&>(bits);
}

// gelu(g) = g/2 (1 + erf(g / sqrt 2)), erf by Abramowitz and Stegun 7.1.26
// (absolute error below 1.5e-7): 1 - erf(a) = q for a >= 0, so the bracket is
// q for negative g and 2 - q otherwise, which keeps small results accurate.
template <class V>
SD_INLINE V gelu(V g) {
    const V a = select(g < 0.0f, -g, g) * 0.70710678118654752f;
    const V t = 1.0f / (1.0f + 0.3275911f * a);
    V p = splat<V>(1.061405429f);
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    const V q = p * t * exp_nonpositive(-a * a);
    return 0.5f * g * select(g < 0.0f, q, 2.0f - q);
}

}  // namespace sd::kernels::rows
