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

// Winograd F(2x2, 3x3): U = G g Gᵀ, V = Bᵀ d B, Y = Aᵀ M A with
//   G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1], Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
//   Aᵀ = [1 1 1 0; 0 1 -1 -1].
// Each helper applies its matrix to one column (or row) of vectors.
inline void apply_g(const Vec g[3], Vec t[4]) {
    t[0] = g[0];
    t[1] = (g[0] + g[1] + g[2]) * 0.5f;
    t[2] = (g[0] - g[1] + g[2]) * 0.5f;
    t[3] = g[2];
}
inline void apply_bt(const Vec d[4], Vec e[4]) {
    e[0] = d[0] - d[2];
    e[1] = d[1] + d[2];
    e[2] = d[2] - d[1];
    e[3] = d[1] - d[3];
}
inline void apply_at(const Vec m[4], Vec y[2]) {
    y[0] = m[0] + m[1] + m[2];
    y[1] = m[1] - m[2] - m[3];
}

void winograd_weights(const float* packed, int64_t icb, int64_t icb_n, int64_t ocb_n, float* u) {
    const int64_t icp = icb_n * W, ocp = ocb_n * W;
    for (int i = 0; i < W; ++i)
        for (int64_t ocb = 0; ocb < ocb_n; ++ocb) {  // innermost: each of U's 16 rows is written in order
            // tap (r, c)'s W outputs for input channel icb*W + i
            const float* g = packed + (ocb * icb_n + icb) * 9 * W * W + i * W;
            Vec t[4][3];  // G g: [4 rows][3 columns]
            for (int c = 0; c < 3; ++c) {
                const Vec col[3] = {load(g + (0 + c) * W * W), load(g + (3 + c) * W * W), load(g + (6 + c) * W * W)};
                Vec out[4];
                apply_g(col, out);
                for (int a = 0; a < 4; ++a) t[a][c] = out[a];
            }
            for (int a = 0; a < 4; ++a) {
                Vec out[4];
                apply_g(t[a], out);
                for (int b = 0; b < 4; ++b) store(u + ((a * 4 + b) * icp + icb * W + i) * ocp + ocb * W, out[b]);
            }
        }
}

void winograd_input(const float* src, const WinogradTiles& g, int64_t t0, int64_t t1, int64_t chunk_first, float* v) {
    const Vec zero{};
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t n = t / g.per_image, r = t % g.per_image;
        const int64_t y0 = 2 * (r / g.across) - 1, x0 = 2 * (r % g.across) - 1;
        bool row_in[4], col_in[4];
        for (int k = 0; k < 4; ++k) {
            row_in[k] = y0 + k >= 0 && y0 + k < g.h;
            col_in[k] = x0 + k >= 0 && x0 + k < g.w;
        }
        float* out = v + (t - chunk_first) * g.icp;
        for (int64_t icb = 0; icb < g.icb; ++icb) {
            const float* plane = src + (n * g.icb + icb) * g.h * g.w * W;
            Vec d[4][4];
            for (int k = 0; k < 4; ++k)
                for (int j = 0; j < 4; ++j)
                    d[k][j] = row_in[k] && col_in[j] ? load(plane + ((y0 + k) * g.w + x0 + j) * W) : zero;
            Vec e[4][4];  // Bᵀ d, column by column
            for (int j = 0; j < 4; ++j) {
                const Vec col[4] = {d[0][j], d[1][j], d[2][j], d[3][j]};
                Vec o[4];
                apply_bt(col, o);
                for (int k = 0; k < 4; ++k) e[k][j] = o[k];
            }
            for (int k = 0; k < 4; ++k) {
                Vec o[4];
                apply_bt(e[k], o);
                for (int j = 0; j < 4; ++j) store(out + (k * 4 + j) * g.chunk * g.icp + icb * W, o[j]);
            }
        }
    }
}

void winograd_output(const float* m, const WinogradTiles& g, int64_t t0, int64_t t1, int64_t chunk_first,
                     const float* bias, bool accumulate, float* dst) {
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t n = t / g.per_image, r = t % g.per_image;
        const int64_t y0 = 2 * (r / g.across), x0 = 2 * (r % g.across);
        const bool two_rows = y0 + 1 < g.h, two_cols = x0 + 1 < g.w;
        const float* in = m + (t - chunk_first) * g.ocp;
        for (int64_t ocb = 0; ocb < g.ocb; ++ocb) {
            Vec s[2][4];  // Aᵀ M, column by column
            for (int j = 0; j < 4; ++j) {
                Vec c[4], o[2];
                for (int k = 0; k < 4; ++k) c[k] = load(in + (k * 4 + j) * g.chunk * g.ocp + ocb * W);
                apply_at(c, o);
                s[0][j] = o[0];
                s[1][j] = o[1];
            }
            const Vec b = bias ? load(bias + ocb * W) : Vec{};
            float* plane = dst + (n * g.ocb + ocb) * g.h * g.w * W;
            for (int k = 0; k < (two_rows ? 2 : 1); ++k) {
                Vec y[2];
                apply_at(s[k], y);
                for (int j = 0; j < (two_cols ? 2 : 1); ++j) {
                    float* p = plane + ((y0 + k) * g.w + x0 + j) * W;
                    store(p, accumulate ? load(p) + (y[j] + b) : y[j] + b);
                }
            }
        }
    }
}

}  // namespace

extern const BlockedKernel kBlockedKernel;
const BlockedKernel kBlockedKernel = {
    SD_BLOCKED_STR(SD_ISA), W, moments, scale_shift, upsample2x, winograd_weights, winograd_input, winograd_output};

}  // namespace sd::kernels::SD_ISA
