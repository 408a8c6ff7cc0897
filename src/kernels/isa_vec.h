// The vector of one instruction-set build and the arithmetic such builds share.
// CMake compiles attention_kernel_isa.cpp and blocked_kernel_isa.cpp once per
// instruction set with SD_ISA the namespace and SD_VEC the width in floats; GCC's
// vector extensions then map each `Vec` operation onto that width. Include only
// from those files: everything here lands in the build's own namespace.
#pragma once
#include <cstdint>

namespace sd::kernels::SD_ISA {
namespace {

constexpr int W = SD_VEC;
typedef float Vec __attribute__((vector_size(W * 4)));
typedef int32_t IVec __attribute__((vector_size(W * 4)));
// The same vector at any float address, for loads and stores.
typedef float UnalignedVec __attribute__((vector_size(W * 4), aligned(4), may_alias));

inline Vec load(const float* p) { return *reinterpret_cast<const UnalignedVec*>(p); }
inline void store(float* p, Vec v) { *reinterpret_cast<UnalignedVec*>(p) = v; }
// Half a vector (W / 2 floats), for a last block of channels that fills only half of one.
typedef float HalfVec __attribute__((vector_size(W * 2)));
typedef float UnalignedHalfVec __attribute__((vector_size(W * 2), aligned(4), may_alias));
inline HalfVec load_half(const float* p) { return *reinterpret_cast<const UnalignedHalfVec*>(p); }
inline void store_half(float* p, HalfVec v) { *reinterpret_cast<UnalignedHalfVec*>(p) = v; }
// x - 0 is x for every x (-0 too), so this compiles to one broadcast, where
// `Vec{} + x` keeps a scalar add for the sign of zero.
inline Vec splat(float x) { return x - Vec{}; }
inline Vec vmin(Vec a, Vec b) { return a < b ? a : b; }
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }

// e^x for x in [-87, 88], which the callers clamp to: x = n ln2 + r with
// |r| <= ln2/2, a degree-7 Taylor polynomial for e^r (relative error below
// 2e-7), and 2^n (n <= 127 there) in the exponent bits.
inline Vec exp_in_range(Vec x) {
    const Vec t = x * 1.44269504088896341f - 0.5f;  // x log2(e), rounded below
    IVec n = __builtin_convertvector(t, IVec);      // truncates toward zero
    n += __builtin_convertvector(n, Vec) > t;       // true is -1: floor for negative t
    n += 1;                                         // floor(t) + 1 = round(x log2 e)
    const Vec nf = __builtin_convertvector(n, Vec);
    const Vec r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
    Vec p = splat(1.0f / 5040);
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const IVec bits = (n + 127) << 23;
    return p * reinterpret_cast<const Vec&>(bits);
}

}  // namespace
}  // namespace sd::kernels::SD_ISA
