#include "kernels/bf16_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/row_math.h"

// One clone per instruction set, chosen when the library loads. GCC lowers
// the 16-float vectors below to whatever width the clone has.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SD_CLONES
#endif

namespace sd::kernels {

namespace {

using namespace rows;
typedef uint32_t UVec __attribute__((vector_size(W * 4)));
typedef uint16_t HVec __attribute__((vector_size(W * 2)));
typedef uint16_t UnalignedHVec __attribute__((vector_size(W * 2), aligned(2), may_alias));

// W bf16 values widened (the top halves of floats).
SD_INLINE Vec load_bf16(const uint16_t* p) {
    const HVec h = *reinterpret_cast<const UnalignedHVec*>(p);
    const UVec bits = __builtin_convertvector(h, UVec) << 16;
    return reinterpret_cast<const Vec&>(bits);
}

// Narrowed with round to nearest, ties to even, as float_to_bf16 (no NaNs here
// but a NaN input: it stays a NaN, since a quiet bit is set in its mantissa top).
SD_INLINE void store_bf16(uint16_t* p, Vec v) {
    UVec bits = reinterpret_cast<const UVec&>(v);
    const UVec nan = (bits & 0x7fffffffu) > 0x7f800000u;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    const UVec raw = reinterpret_cast<const UVec&>(v);
    bits = (nan & ((raw >> 16) | 0x40u)) | (~nan & (bits >> 16));
    *reinterpret_cast<UnalignedHVec*>(p) = __builtin_convertvector(bits, HVec);
}

SD_INLINE float hsum(Vec v) {
    float s = 0;
    for (int i = 0; i < W; ++i) s += v[i];
    return s;
}

// Sum of x - shift over n values (any n), in fp32 lanes; sums of at most
// kSpan values are added in double so long blocks keep their precision.
constexpr int64_t kSpan = 4096;

SD_INLINE double sum_shifted(const uint16_t* x, int64_t n, float shift, bool squares) {
    double total = 0;
    for (int64_t s = 0; s < n; s += kSpan) {
        const int64_t e = std::min(n, s + kSpan);
        Vec acc = Vec{};
        int64_t i = s;
        for (; i + W <= e; i += W) {
            const Vec d = load_bf16(x + i) - shift;
            acc += squares ? d * d : d;
        }
        float tail = 0;
        for (; i < e; ++i) {
            const float d = bf16_to_float(x[i]) - shift;
            tail += squares ? d * d : d;
        }
        total += static_cast<double>(hsum(acc)) + tail;
    }
    return total;
}

// (x - mean) * rstd * w + b for n values with one (w, b): y = x * scale + offset.
SD_INLINE void normalize(const uint16_t* x, uint16_t* y, int64_t n, float scale, float offset) {
    int64_t i = 0;
    for (; i + W <= n; i += W) store_bf16(y + i, load_bf16(x + i) * scale + offset);
    for (; i < n; ++i) y[i] = float_to_bf16(bf16_to_float(x[i]) * scale + offset);
}

// Mean and 1 / sqrt(variance + eps) of n values (biased variance, as the norms).
SD_INLINE void moments(const uint16_t* x, int64_t n, float eps, float& mean, float& rstd) {
    mean = static_cast<float>(sum_shifted(x, n, 0.0f, false) / static_cast<double>(n));
    const double var = sum_shifted(x, n, mean, true) / static_cast<double>(n);
    rstd = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
}

}  // namespace

SD_CLONES void geglu_bf16(const uint16_t* in, const float* bias, uint16_t* out, int64_t width, int64_t begin,
                          int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
        const uint16_t* x = in + r * 2 * width;
        const uint16_t* g = x + width;
        uint16_t* y = out + r * width;
        int64_t c = 0;
        for (; c + W <= width; c += W) {
            Vec a = load_bf16(x + c), b = load_bf16(g + c);
            if (bias) {
                a += *reinterpret_cast<const UnalignedVec*>(bias + c);
                b += *reinterpret_cast<const UnalignedVec*>(bias + width + c);
            }
            store_bf16(y + c, a * gelu(b));
        }
        if (c < width) {  // the last partial vector through a padded copy
            const int64_t n = width - c;
            uint16_t xs[W] = {}, gs[W] = {}, ys[W];
            float xb[W] = {}, gb[W] = {};
            std::memcpy(xs, x + c, sizeof(uint16_t) * n);
            std::memcpy(gs, g + c, sizeof(uint16_t) * n);
            if (bias) {
                std::memcpy(xb, bias + c, sizeof(float) * n);
                std::memcpy(gb, bias + width + c, sizeof(float) * n);
            }
            const Vec a = load_bf16(xs) + *reinterpret_cast<const UnalignedVec*>(xb);
            const Vec b = load_bf16(gs) + *reinterpret_cast<const UnalignedVec*>(gb);
            store_bf16(ys, a * gelu(b));
            std::memcpy(y + c, ys, sizeof(uint16_t) * n);
        }
    }
}

SD_CLONES void layer_norm_bf16(const uint16_t* in, uint16_t* out, int64_t width, const float* weight, const float* bias,
                               float eps, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
        const uint16_t* x = in + r * width;
        uint16_t* y = out + r * width;
        float mean, rstd;
        moments(x, width, eps, mean, rstd);
        int64_t c = 0;
        for (; c + W <= width; c += W) {
            Vec v = (load_bf16(x + c) - mean) * rstd;
            if (weight) v *= *reinterpret_cast<const UnalignedVec*>(weight + c);
            if (bias) v += *reinterpret_cast<const UnalignedVec*>(bias + c);
            store_bf16(y + c, v);
        }
        for (; c < width; ++c) {
            float v = (bf16_to_float(x[c]) - mean) * rstd;
            if (weight) v *= weight[c];
            if (bias) v += bias[c];
            y[c] = float_to_bf16(v);
        }
    }
}

SD_CLONES void group_norm_bf16(const uint16_t* in, uint16_t* out, int64_t channels, int64_t spatial, int64_t groups,
                               const float* weight, const float* bias, float eps, int64_t begin, int64_t end) {
    const int64_t per_group = channels / groups, block = per_group * spatial;
    for (int64_t bg = begin; bg < end; ++bg) {
        const uint16_t* x = in + bg * block;
        uint16_t* y = out + bg * block;
        float mean, rstd;
        moments(x, block, eps, mean, rstd);
        const int64_t c0 = (bg % groups) * per_group;
        for (int64_t c = 0; c < per_group; ++c) {
            const float w = weight ? weight[c0 + c] : 1.0f, b = bias ? bias[c0 + c] : 0.0f;
            normalize(x + c * spatial, y + c * spatial, spatial, rstd * w, b - mean * rstd * w);
        }
    }
}

}  // namespace sd::kernels
