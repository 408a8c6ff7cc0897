// One instruction-set build of the blocked layout's element-wise kernels
// (blocked_kernel.h). CMake compiles this file once per instruction set with
// SD_ISA the namespace and SD_VEC the vector width in floats, which is also the
// layout's channel block: one pixel of one plane is exactly one vector.
#include <algorithm>
#include <cstring>

#include "kernels/blocked_kernel.h"
#include "kernels/isa_vec.h"

#define SD_BLOCKED_STR2(x) #x
#define SD_BLOCKED_STR(x) SD_BLOCKED_STR2(x)

namespace sd::kernels::SD_ISA {

namespace {

// e^x, clamped to [-87, 88] first, where it stays finite.
inline Vec vexp(Vec x) { return exp_in_range(vmin(vmax(x, splat(-87.0f)), splat(88.0f))); }

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
