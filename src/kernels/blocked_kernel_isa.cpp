// One instruction-set build of the blocked layout's element-wise kernels
// (blocked_kernel.h). CMake compiles this file once per instruction set with
// SD_ISA the namespace and SD_VEC the vector width in floats, which is also the
// layout's channel block: one pixel of one plane is exactly one vector.
#include <algorithm>
#include <cstring>

#include "kernels/blocked_kernel.h"

#define SD_BLOCKED_STR2(x) #x
#define SD_BLOCKED_STR(x) SD_BLOCKED_STR2(x)

namespace sd::kernels::SD_ISA {

namespace {

constexpr int W = SD_VEC;
typedef float Vec __attribute__((vector_size(W * 4)));
typedef int32_t IVec __attribute__((vector_size(W * 4)));
typedef float UnalignedVec __attribute__((vector_size(W * 4), aligned(4), may_alias));

inline Vec load(const float* p) { return *reinterpret_cast<const UnalignedVec*>(p); }
inline void store(float* p, Vec v) { *reinterpret_cast<UnalignedVec*>(p) = v; }
inline Vec splat(float x) { return x - Vec{}; }
inline Vec vmin(Vec a, Vec b) { return a < b ? a : b; }
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }

// e^x for x in [-87, 88] (clamped there): x = n ln2 + r, |r| <= ln2/2, a
// degree-7 Taylor polynomial for e^r (relative error below 2e-7), 2^n in the
// exponent bits.
inline Vec vexp(Vec x) {
    x = vmin(vmax(x, splat(-87.0f)), splat(88.0f));
    const Vec t = x * 1.44269504088896341f - 0.5f;
    IVec n = __builtin_convertvector(t, IVec);  // truncates toward zero
    n += __builtin_convertvector(n, Vec) > t;   // true is -1: floor for negative t
    n += 1;                                     // round(x log2 e)
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
    // n can reach 128 at x = 88: build 2^n as two halves so the exponent never overflows.
    const IVec h1 = ((n >> 1) + 127) << 23;
    const IVec h2 = ((n - (n >> 1)) + 127) << 23;
    return p * reinterpret_cast<const Vec&>(h1) * reinterpret_cast<const Vec&>(h2);
}

// x * sigmoid(x) = x / (1 + e^-x).
inline Vec silu(Vec x) { return x / (1.0f + vexp(-x)); }

void moments(const float* x, int64_t hw, const float* add, double* sum, double* sumsq) {
    // Float partial sums over short runs, added into doubles: the plane can hold
    // 262144 pixels (the VAE at 512²), too many for one float accumulator.
    constexpr int64_t kRun = 64;
    const Vec a = add ? load(add) : Vec{};
    double s[W] = {}, q[W] = {};
    for (int64_t p0 = 0; p0 < hw; p0 += kRun) {
        const int64_t p1 = std::min(hw, p0 + kRun);
        Vec vs{}, vq{};
        for (int64_t p = p0; p < p1; ++p) {
            const Vec v = load(x + p * W) + a;
            vs += v;
            vq += v * v;
        }
        for (int l = 0; l < W; ++l) {
            s[l] += vs[l];
            q[l] += vq[l];
        }
    }
    for (int l = 0; l < W; ++l) {
        sum[l] = s[l];
        sumsq[l] = q[l];
    }
}

void scale_shift(const float* x, int64_t pixels, const float* add, const float* scale, const float* shift, bool act,
                 float* y) {
    const Vec a = add ? load(add) : Vec{};
    const Vec sc = load(scale), sh = load(shift);
    if (act) {
        for (int64_t p = 0; p < pixels; ++p) store(y + p * W, silu((load(x + p * W) + a) * sc + sh));
    } else {
        for (int64_t p = 0; p < pixels; ++p) store(y + p * W, (load(x + p * W) + a) * sc + sh);
    }
}

void upsample2x(const float* x, int64_t h, int64_t w, float* y, int64_t row_begin, int64_t row_end) {
    (void)h;
    for (int64_t r = row_begin; r < row_end; ++r) {
        const float* src = x + r * w * W;
        float* top = y + (2 * r) * (2 * w) * W;
        for (int64_t c = 0; c < w; ++c) {
            const Vec v = load(src + c * W);
            store(top + (2 * c) * W, v);
            store(top + (2 * c + 1) * W, v);
        }
        std::memcpy(top + 2 * w * W, top, sizeof(float) * 2 * w * W);
    }
}

}  // namespace

extern const BlockedKernel kBlockedKernel;
const BlockedKernel kBlockedKernel = {SD_BLOCKED_STR(SD_ISA), W, moments, scale_shift, upsample2x};

}  // namespace sd::kernels::SD_ISA
