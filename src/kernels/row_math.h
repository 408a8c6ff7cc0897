// Vector arithmetic shared by the row kernels (bf16_rows.cpp, f32_rows.cpp):
// 16-float GCC vectors, which each instruction-set build of a caller lowers to
// its own width, and the exp and gelu both kernels compute with. Include only
// from those files: every function is inlined into a caller built per ISA.
#pragma once
#include <cstdint>

#pragma GCC diagnostic ignored "-Wpsabi"

#define SD_INLINE inline __attribute__((always_inline))

namespace sd::kernels::rows {

constexpr int W = 16;
typedef float Vec __attribute__((vector_size(W * 4)));
typedef int32_t IVec __attribute__((vector_size(W * 4)));
typedef float UnalignedVec __attribute__((vector_size(W * 4), aligned(4), may_alias));

SD_INLINE Vec splat(float x) { return x - Vec{}; }

SD_INLINE Vec select(IVec mask, Vec a, Vec b) {
    const IVec r = (mask & reinterpret_cast<const IVec&>(a)) | (~mask & reinterpret_cast<const IVec&>(b));
    return reinterpret_cast<const Vec&>(r);
}

// e^x for x <= 0: x = n ln2 + r, a degree-6 polynomial in r, 2^n in the exponent bits.
SD_INLINE Vec exp_nonpositive(Vec x) {
    x = select(x < -87.0f, splat(-87.0f), x);
    const Vec t = x * 1.44269504088896341f - 0.5f;
    IVec n = __builtin_convertvector(t, IVec);  // toward zero: ceil(t) for t < 0, round(x log2 e)
    const Vec nf = __builtin_convertvector(n, Vec);
    const Vec r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
    Vec p = splat(1.0f / 720);
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const IVec bits = (n + 127) << 23;
    return p * reinterpret_cast<const Vec&>(bits);
}

// gelu(g) = g/2 (1 + erf(g / sqrt 2)), erf by Abramowitz and Stegun 7.1.26
// (absolute error below 1.5e-7): 1 - erf(a) = q for a >= 0, so the bracket is
// q for negative g and 2 - q otherwise, which keeps small results accurate.
SD_INLINE Vec gelu(Vec g) {
    const Vec a = select(g < 0.0f, -g, g) * 0.70710678118654752f;
    const Vec t = 1.0f / (1.0f + 0.3275911f * a);
    Vec p = splat(1.061405429f);
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    const Vec q = p * t * exp_nonpositive(-a * a);
    return 0.5f * g * select(g < 0.0f, q, 2.0f - q);
}

}  // namespace sd::kernels::rows
