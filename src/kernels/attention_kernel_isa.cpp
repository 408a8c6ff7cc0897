// One instruction-set build of the fused attention kernel (attention_kernel.h),
// its vector arithmetic in isa_vec.h. The builds with -mavx512bf16 run bf16
// problems' products in bf16 (below): on AMX tiles with -mamx-bf16, else on
// avx512_bf16's dot product.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention_kernel.h"
#include "kernels/attention_tiles.h"
#include "kernels/bf16.h"
#include "kernels/isa_vec.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace sd::kernels::SD_ISA {

namespace {

// e^x for x <= 0 (scores minus their running maximum). Below -87 the result is
// clamped to about 1e-38, which adds nothing visible to a row sum that holds a 1.
inline Vec exp_nonpositive(Vec x) { return exp_in_range(vmax(x, splat(-87.0f))); }

inline float hmax(Vec v) {
    float m = v[0];
    for (int i = 1; i < W; ++i) m = std::max(m, v[i]);
    return m;
}
inline float hsum(Vec v) {
    float s = 0;
    for (int i = 0; i < W; ++i) s += v[i];
    return s;
}

// S[r][j] = scale * sum_c Q[r][c] KT[c][j] for R rows and 2W keys, all in
// registers across the reduction over the head width. KT is a panel of
// kKeyAlign keys (attention_tiles.h), so the loads run through memory in order.
template <int R>
inline void score_block(const float* q, int64_t d, const float* kt, float scale, float* s, int64_t s_row) {
    Vec acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = Vec{};
    for (int64_t c = 0; c < d; ++c) {
        const Vec k0 = load(kt + c * kKeyAlign);
        const Vec k1 = load(kt + c * kKeyAlign + W);
        for (int r = 0; r < R; ++r) {
            const Vec qv = splat(q[r * d + c]);
            acc[r][0] += qv * k0;
            acc[r][1] += qv * k1;
        }
    }
    for (int r = 0; r < R; ++r) {
        store(s + r * s_row, acc[r][0] * scale);
        store(s + r * s_row + W, acc[r][1] * scale);
    }
}

// O[r][0..NV*W) += sum_j P[r][j] V[j][0..NV*W) for R rows over `keys` keys. With
// kHalfLast the last vector holds W/2 channels and padding (SD 1.x's heads of 40 in
// 16-float vectors: 16 + 16 + 8): its sums run half wide, which takes Zen 4 half a
// full-width FMA. The channels summed, and the order they are summed in, are the same.
template <int R, int NV, bool kHalfLast = false>
inline void value_block(const float* p, int64_t p_row, const float* v, int64_t dp, int64_t keys, float* o) {
    constexpr int kFull = kHalfLast ? NV - 1 : NV;
    Vec acc[R][NV];
    HalfVec half[R];
    for (int r = 0; r < R; ++r) {
        for (int i = 0; i < kFull; ++i) acc[r][i] = load(o + r * dp + i * W);
        if (kHalfLast) half[r] = load_half(o + r * dp + kFull * W);
    }
    for (int64_t j = 0; j < keys; ++j) {
        Vec vv[NV];
        for (int i = 0; i < kFull; ++i) vv[i] = load(v + j * dp + i * W);
        const HalfVec vh = kHalfLast ? load_half(v + j * dp + kFull * W) : HalfVec{};
        for (int r = 0; r < R; ++r) {
            const float pj = p[r * p_row + j];
            const Vec pr = splat(pj);
            for (int i = 0; i < kFull; ++i) acc[r][i] += pr * vv[i];
            if (kHalfLast) half[r] += pj * vh;
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int i = 0; i < kFull; ++i) store(o + r * dp + i * W, acc[r][i]);
        if (kHalfLast) store_half(o + r * dp + kFull * W, half[r]);
    }
}

// Rows per register block: 4 with 32 vector registers, 2 with 16. Scores take
// kWideRows rows: with 32 registers 8 (16 accumulators: half the key loads per
// FMA, and enough independent sums to hide the FMA latency), with 16 registers 4
// (8 accumulators, which two FMA ports of latency 4 need); and so do values for
// heads of up to 3 vectors with 32 (SD 1.x's 40 channels: 24 accumulators). Each
// sum still runs in the same order, so the results are the same bits.
constexpr int kRows = W >= 16 ? 4 : 2;
constexpr int kWideRows = W >= 16 ? 8 : 4;
constexpr int kValueVecs = 4;

// O[R rows][vecs vectors] += P v: blocks of 4 vectors, or of 5 with 16 registers
// where the head is a multiple of 5 vectors (SD 1.x's heads of 40, 80 and 160
// channels in 8-float vectors): 2 rows of 5 are 10 accumulators in 16 registers,
// where 4 + 1 left the last block 2, too few to hide the FMA latency.
template <int R>
void values(const float* p, int64_t p_row, const float* v, int64_t dp, int64_t vecs, int64_t keys, float* o) {
    int64_t i = 0;
    if (W < 16 && vecs % 5 == 0)
        for (; i < vecs; i += 5) value_block<R, 5>(p, p_row, v + i * W, dp, keys, o + i * W);
    for (; i + kValueVecs <= vecs; i += kValueVecs)
        value_block<R, kValueVecs>(p, p_row, v + i * W, dp, keys, o + i * W);
    switch (vecs - i) {
        case 3:
            value_block<R, 3>(p, p_row, v + i * W, dp, keys, o + i * W);
            break;
        case 2:
            value_block<R, 2>(p, p_row, v + i * W, dp, keys, o + i * W);
            break;
        case 1:
            value_block<R, 1>(p, p_row, v + i * W, dp, keys, o + i * W);
            break;
        default:
            break;
    }
}

// values() for kWideRows rows of a head of d channels (rows dp apart): the vectors
// that hold its channels (the padding to dp gives nothing read), in one block
// where the head is at most 3 vectors wide and there are 32 registers.
void values_wide(const float* p, int64_t p_row, const float* v, int64_t dp, int64_t d, int64_t keys, float* o) {
    const int64_t vecs = (d + W - 1) / W;
    const bool half_last = W >= 16 && d % W != 0 && d % W <= W / 2;
    switch (vecs) {
        case 3:
            if (kWideRows == 8 && half_last) return value_block<kWideRows, 3, true>(p, p_row, v, dp, keys, o);
            if (kWideRows == 8) return value_block<kWideRows, 3>(p, p_row, v, dp, keys, o);
            break;
        case 2:
            if (kWideRows == 8) return value_block<kWideRows, 2>(p, p_row, v, dp, keys, o);
            break;
        case 1:
            if (kWideRows == 8) return value_block<kWideRows, 1>(p, p_row, v, dp, keys, o);
            break;
        default:
            break;
    }
    for (int r = 0; r < kWideRows; r += kRows) values<kRows>(p + r * p_row, p_row, v, dp, vecs, keys, o + r * dp);
}

// n floats from an fp32 row, or widened from a bf16 one.
inline void read_row(float* dst, const float* f32, const uint16_t* bf16, int64_t n) {
    if (bf16)
        for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(bf16[i]);
    else
        std::memcpy(dst, f32, sizeof(float) * n);
}

#if defined(__AVX512BF16__)
// bf16 problems on a CPU with bf16 instructions: both products in bf16 with
// fp32 sums. AMX's tiles multiply 16x32 bf16 rows by 32x16 bf16 columns, and
// vdpbf16ps adds 16 products of bf16 pairs into 16 fp32 lanes; both want the
// reduced dimension's pairs side by side. So kᵀ is packed as panels of 16
// keys holding each key's channel pair side by side (channels padded to 32), v
// as key pairs holding 16 channels each, and one layout serves both. Scores,
// the online softmax and the sums stay fp32; the probabilities are rounded to
// bf16 for their product with v (as flash attention does on GPUs).
constexpr int64_t kLanes = 16;
constexpr int64_t kTileRows = 16;  // query rows per softmax group (an AMX tile's rows)

inline int64_t k_pairs(int64_t d) { return (d + 31) / 32 * 16; }  // channel pairs, padded to whole tiles
// Offsets in one (batch, head)'s pack, in bf16 values: kᵀ's panel of keys
// [16 pn, 16 pn + 16), then v's key pair jp (each `vecs` blocks of 16 channels).
inline int64_t k_panel(int64_t pn, int64_t d2) { return pn * d2 * 2 * kLanes; }
inline int64_t v_pair(int64_t jp, int64_t vecs) { return jp * vecs * 2 * kLanes; }

#if defined(__AMX_BF16__)
struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Tiles 0-3 accumulate, 4 holds the left operand, 5 the right one; every tile is 16 rows of 64 bytes.
void configure_tiles() {
    TileConfig cfg;
    for (int t = 0; t < 6; ++t) cfg.colsb[t] = 64, cfg.rows[t] = kTileRows;
    _tile_loadconfig(&cfg);
}
#endif

// 2^t for t <= 16 (lazy_softmax_rows' bound): t = n + r with |r| <= 1/2, a degree-4 polynomial for 2^r
// fitted for relative error (below 2.7e-6 in float: enough for probabilities
// then rounded to bf16, 2^-9) and vscalefps for the 2^n, which saves the
// exponent-bit arithmetic of exp_nonpositive in the loop that bounds this
// build's speed. A very negative t gives 0 (r is 0 once t is past 2^23).
inline __m512 exp2_bounded(__m512 t) {
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(t, n);
    __m512 q = _mm512_set1_ps(9.569989517331123e-3f);
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(5.591757968068123e-2f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(2.40247443318367e-1f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(6.931218504905701e-1f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(9.999992847442627e-1f));
    return _mm512_scalef_ps(q, n);
}

// The online softmax of one group of 16 rows of raw scores (s: rows of s_row
// floats, `keys` of them a multiple of 32, padding from `valid` on) against
// the rows' running maxima and sums, in raw-score units:
// e^(scale (s - max)) = 2^(c s - c max) with c = scale log2 e, so the scale
// costs no pass of its own (it needs scale > 0, which keeps the maximum's
// place). Padding keys score -1e30: far below any real score, and finite after
// the product with c (up to c = 3e8), so that r stays finite.
// Writes the bf16 probabilities to pb (rows of s_row, zero on padding keys)
// and the factors the rows' earlier outputs take to `alpha`.
inline void softmax_rows(float* s, int64_t s_row, int64_t keys, int64_t valid, float c, float* row_max, float* row_sum,
                         uint16_t* pb, float* alpha) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    alignas(64) float group_max[kTileRows];
    for (int64_t i = 0; i < kTileRows; ++i) {
        float* sr = s + i * s_row;
        std::fill(sr + valid, sr + keys, -1e30f);
        __m512 m0 = _mm512_set1_ps(neg_inf), m1 = m0;
        for (int64_t j = 0; j < keys; j += 2 * W) {
            m0 = _mm512_max_ps(m0, _mm512_loadu_ps(sr + j));
            m1 = _mm512_max_ps(m1, _mm512_loadu_ps(sr + j + W));
        }
        group_max[i] = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    }
    // All 16 rows' factors at once: 0 for a first key tile, exactly 1 where the maximum stays.
    const __m512 old_max = _mm512_loadu_ps(row_max);
    const __m512 new_max = _mm512_max_ps(old_max, _mm512_load_ps(group_max));
    __m512 a = exp2_bounded(_mm512_mul_ps(_mm512_sub_ps(old_max, new_max), _mm512_set1_ps(c)));
    a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(old_max, new_max, _CMP_EQ_OQ), a, _mm512_set1_ps(1.0f));
    a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(old_max, _mm512_set1_ps(neg_inf), _CMP_EQ_OQ), a, _mm512_setzero_ps());
    _mm512_storeu_ps(row_max, new_max);
    _mm512_storeu_ps(alpha, a);
    alignas(64) float sums[kTileRows];
    const __m512 vc = _mm512_set1_ps(c);
    for (int64_t i = 0; i < kTileRows; ++i) {
        const float* sr = s + i * s_row;
        uint16_t* pr = pb + i * s_row;
        const __m512 shift = _mm512_set1_ps(-row_max[i] * c);
        __m512 s0 = _mm512_setzero_ps(), s1 = s0;
        for (int64_t j = 0; j < keys; j += 2 * W) {
            const __m512 e0 = exp2_bounded(_mm512_fmadd_ps(_mm512_loadu_ps(sr + j), vc, shift));
            const __m512 e1 = exp2_bounded(_mm512_fmadd_ps(_mm512_loadu_ps(sr + j + W), vc, shift));
            s0 = _mm512_add_ps(s0, e0);
            s1 = _mm512_add_ps(s1, e1);
            _mm512_storeu_si512(pr + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
        }
        std::fill(pr + valid, pr + keys, uint16_t{0});
        sums[i] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
    _mm512_storeu_ps(row_sum, _mm512_fmadd_ps(_mm512_loadu_ps(row_sum), a, _mm512_load_ps(sums)));
}

// The bf16 route needs all four operands in bf16, and a positive scale (softmax_rows).
inline bool bf16_route(const AttentionProblem& p) {
    return p.k_bf16 && p.v_bf16 && p.q_bf16 && p.out_bf16 && p.scale > 0;
}

// Packs one (batch, head)'s k and v, padding included, in vectors: kᵀ's panels
// are a transpose of 16 keys' channel pairs (a gather each), v's key pairs
// interleave two keys' rows 16 channels at a time.
void pack_bf16(const AttentionProblem& p, int64_t bh) {
    const int64_t m_pad = padded_keys(p.m), dp = padded_width(p.d), d2 = k_pairs(p.d), vecs = dp / kLanes;
    const int64_t b = bh / p.heads, h = bh % p.heads, whole_pairs = p.d / 2;
    uint16_t* kt = reinterpret_cast<uint16_t*>(p.packed + bh * packed_head_floats(p));
    uint16_t* vp = kt + m_pad * d2 * 2;  // fits: m_pad (2 d2 + dp) halves <= 2 m_pad (d + dp) (attention_kernel.cpp)
    const __m512i zero = _mm512_setzero_si512();
    const __m512i row_bytes =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(static_cast<int32_t>(p.k_row * 2)));
    for (int64_t j0 = 0; j0 < m_pad; j0 += kLanes) {
        const int64_t n = std::clamp<int64_t>(p.m - j0, 0, kLanes);  // real keys in this panel
        const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);
        uint32_t* panel = reinterpret_cast<uint32_t*>(kt + k_panel(j0 / kLanes, d2));  // [pair][16 keys]
        const uint16_t* k0 = p.k_bf16 + b * p.k_batch + std::min(j0, p.m - 1) * p.k_row + h * p.d;
        for (int64_t cp = 0; cp < d2; ++cp)
            _mm512_storeu_si512(
                panel + cp * kLanes,
                cp < whole_pairs ? _mm512_mask_i32gather_epi32(zero, live, row_bytes, k0 + 2 * cp, 1) : zero);
        if (p.d % 2)  // an odd head's last channel pairs with padding
            for (int64_t jj = 0; jj < n; ++jj)
                reinterpret_cast<uint16_t*>(panel + whole_pairs * kLanes + jj)[0] = k0[jj * p.k_row + p.d - 1];
    }
    for (int64_t j = 0; j < m_pad; j += 2) {
        const uint16_t* v0 = p.v_bf16 + b * p.v_batch + std::min(j, p.m - 1) * p.v_row + h * p.d;
        for (int64_t i = 0; i < vecs; ++i) {
            const int64_t c = i * kLanes, left = std::min<int64_t>(p.d - c, kLanes);
            const __mmask16 ch = static_cast<__mmask16>((1u << left) - 1);
            const __m256i a = j < p.m ? _mm256_maskz_loadu_epi16(ch, v0 + c) : _mm256_setzero_si256();
            const __m256i n1 = j + 1 < p.m ? _mm256_maskz_loadu_epi16(ch, v0 + p.v_row + c) : _mm256_setzero_si256();
            _mm512_storeu_si512(
                vp + v_pair(j / 2, vecs) + i * 2 * kLanes,
                _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(n1), 16)));
        }
    }
}

#if defined(__AMX_BF16__)
// Scores of 16 query rows (q: bf16, row length 2 d2) against N panels of 16
// keys from `kt`, unscaled, into s (fp32 rows of s_row floats).
template <int N>
inline void score_tiles(const uint16_t* q, int64_t d2, const uint16_t* kt, float* s, int64_t s_row) {
    _tile_zero(0);
    if (N > 1) _tile_zero(1);
    if (N > 2) _tile_zero(2);
    if (N > 3) _tile_zero(3);
    const int64_t panel = d2 * 2 * kLanes;
    for (int64_t kc = 0; kc < d2; kc += kTileRows) {  // 32 channels a step
        _tile_loadd(4, q + 2 * kc, 4 * d2);
        _tile_loadd(5, kt + kc * 2 * kLanes, 64);
        _tile_dpbf16ps(0, 4, 5);
        if (N > 1) {
            _tile_loadd(5, kt + panel + kc * 2 * kLanes, 64);
            _tile_dpbf16ps(1, 4, 5);
        }
        if (N > 2) {
            _tile_loadd(5, kt + 2 * panel + kc * 2 * kLanes, 64);
            _tile_dpbf16ps(2, 4, 5);
        }
        if (N > 3) {
            _tile_loadd(5, kt + 3 * panel + kc * 2 * kLanes, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    _tile_stored(0, s, s_row * 4);
    if (N > 1) _tile_stored(1, s + kLanes, s_row * 4);
    if (N > 2) _tile_stored(2, s + 2 * kLanes, s_row * 4);
    if (N > 3) _tile_stored(3, s + 3 * kLanes, s_row * 4);
}

// O[16 rows][N blocks of 16 channels] += P (bf16, 16 rows of p_row) · v over
// `keys` keys (a multiple of 32) from key pair 0 of `vp`.
template <int N>
inline void value_tiles(const uint16_t* pb, int64_t p_row, const uint16_t* vp, int64_t vecs, int64_t keys, float* o,
                        int64_t dp) {
    _tile_loadd(0, o, dp * 4);
    if (N > 1) _tile_loadd(1, o + kLanes, dp * 4);
    if (N > 2) _tile_loadd(2, o + 2 * kLanes, dp * 4);
    if (N > 3) _tile_loadd(3, o + 3 * kLanes, dp * 4);
    const int64_t stride = vecs * 2 * kLanes * 2;  // bytes from one key pair to the next
    for (int64_t j = 0; j < keys; j += 2 * kTileRows) {
        _tile_loadd(4, pb + j, p_row * 2);
        const uint16_t* v = vp + v_pair(j / 2, vecs);
        _tile_loadd(5, v, stride);
        _tile_dpbf16ps(0, 4, 5);
        if (N > 1) {
            _tile_loadd(5, v + 2 * kLanes, stride);
            _tile_dpbf16ps(1, 4, 5);
        }
        if (N > 2) {
            _tile_loadd(5, v + 4 * kLanes, stride);
            _tile_dpbf16ps(2, 4, 5);
        }
        if (N > 3) {
            _tile_loadd(5, v + 6 * kLanes, stride);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    _tile_stored(0, o, dp * 4);
    if (N > 1) _tile_stored(1, o + kLanes, dp * 4);
    if (N > 2) _tile_stored(2, o + 2 * kLanes, dp * 4);
    if (N > 3) _tile_stored(3, o + 3 * kLanes, dp * 4);
}

// Scores of the 16 query rows of q (bf16, rows of 2 d2) against `keys` keys (a
// multiple of 32) from the panel kt, unscaled, into s (fp32 rows of s_row floats).
inline void group_scores(const uint16_t* q, int64_t d2, int64_t, const uint16_t* kt, int64_t keys, float* s,
                         int64_t s_row) {
    int64_t j = 0;
    for (; j + 4 * kLanes <= keys; j += 4 * kLanes) score_tiles<4>(q, d2, kt + k_panel(j / kLanes, d2), s + j, s_row);
    if (j < keys)  // 32 keys left
        score_tiles<2>(q, d2, kt + k_panel(j / kLanes, d2), s + j, s_row);
}

// O[16 rows][vecs blocks of 16 channels] += P (bf16, 16 rows of p_row) · v over `keys` keys from vt.
inline void group_values(const uint16_t* pb, int64_t p_row, const uint16_t* vt, int64_t vecs, int64_t /*d*/,
                         int64_t keys, float* o, int64_t dp) {
    int64_t i = 0;
    for (; i + 4 <= vecs; i += 4) value_tiles<4>(pb, p_row, vt + i * 2 * kLanes, vecs, keys, o + i * kLanes, dp);
    switch (vecs - i) {
        case 3:
            value_tiles<3>(pb, p_row, vt + i * 2 * kLanes, vecs, keys, o + i * kLanes, dp);
            break;
        case 2:
            value_tiles<2>(pb, p_row, vt + i * 2 * kLanes, vecs, keys, o + i * kLanes, dp);
            break;
        case 1:
            value_tiles<1>(pb, p_row, vt + i * 2 * kLanes, vecs, keys, o + i * kLanes, dp);
            break;
        default:
            break;
    }
}

// The tiles leave scores in memory anyway, and no AMX CPU was at hand to
// measure the register-fed softmax below: this build keeps softmax_rows.
inline bool lazy_softmax_rows(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, float, const float*,
                              float*, uint16_t*, int64_t) {
    return false;
}

inline void begin_products() { configure_tiles(); }
inline void end_products() { _tile_release(); }
#else
// Without AMX: vdpbf16ps, 16 fp32 sums a vector, each adding a pair of bf16
// products; the other operand's pair is broadcast to every lane.
inline __m512bh pair_splat(const uint16_t* x) {
    int32_t bits;
    std::memcpy(&bits, x, sizeof bits);
    return (__m512bh)_mm512_set1_epi32(bits);
}
inline __m512bh load_pairs(const uint16_t* x) { return (__m512bh)_mm512_loadu_si512(x); }

constexpr int kDotRows = 8;  // rows per register block: 16 or 24 sums in 32 registers

// S[r][0..32) for R query rows (q_row apart) against the panels k0 and k1 of
// 16 keys, over `pairs` channel pairs, handed in registers to finish(r, S[r][0..16), S[r][16..32)).
template <int R, class Finish>
inline void score_dots(const uint16_t* q, int64_t q_row, int64_t pairs, const uint16_t* k0, const uint16_t* k1,
                       Finish&& finish) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t cp = 0; cp < pairs; ++cp) {
        const __m512bh a = load_pairs(k0 + cp * 2 * kLanes), b = load_pairs(k1 + cp * 2 * kLanes);
        for (int r = 0; r < R; ++r) {
            const __m512bh qv = pair_splat(q + r * q_row + 2 * cp);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qv, a);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qv, b);
        }
    }
    // Unrolled, so that acc stays in registers rather than an array in memory.
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) finish(r, acc[r][0], acc[r][1]);
}

// The scores of a group of 16 query rows against `keys` keys from kt, 32 keys of kDotRows
// rows at a time, each row's handed to finish(row, first key, S[row][key..+16), S[row][key+16..+32)).
// As the AMX build's: the channel pairs past the head's width are zero in q and kᵀ alike, so they are skipped.
template <class Finish>
inline void group_score_dots(const uint16_t* q, int64_t d2, int64_t d, const uint16_t* kt, int64_t keys,
                             Finish&& finish) {
    const int64_t pairs = (d + 1) / 2, panel = d2 * 2 * kLanes;
    for (int64_t r = 0; r < kTileRows; r += kDotRows)
        for (int64_t j = 0; j < keys; j += 2 * kLanes)
            score_dots<kDotRows>(q + r * 2 * d2, 2 * d2, pairs, kt + (j / kLanes) * panel,
                                 kt + (j / kLanes + 1) * panel,
                                 [&](int i, __m512 s0, __m512 s1) { finish(r + i, j, s0, s1); });
}

inline void group_scores(const uint16_t* q, int64_t d2, int64_t d, const uint16_t* kt, int64_t keys, float* s,
                         int64_t s_row) {
    group_score_dots(q, d2, d, kt, keys, [&](int64_t row, int64_t j, __m512 s0, __m512 s1) {
        _mm512_storeu_ps(s + row * s_row + j, s0);
        _mm512_storeu_ps(s + row * s_row + j + kLanes, s1);
    });
}

// Scores at most 2^kLazyBound times a row's reference maximum need no new maximum.
constexpr float kLazyBound = 16.0f;

// softmax_rows without a pass over stored scores: each row keeps its running
// maximum as the reference while every new score stays within 2^kLazyBound
// of it, so its probabilities come straight from the score registers, the
// earlier sums keep their scale (no factor), and the scores never reach
// memory. False, with nothing changed, where a row has no maximum yet or a
// score passes the bound: softmax_rows then runs as usual.
inline bool lazy_softmax_rows(const uint16_t* q, int64_t d2, int64_t d, const uint16_t* kt, int64_t keys, int64_t valid,
                              float c, const float* row_max, float* row_sum, uint16_t* pb, int64_t p_row) {
    const __m512 ref = _mm512_loadu_ps(row_max);
    if (_mm512_cmp_ps_mask(ref, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ)) return false;
    alignas(64) float shift[kTileRows];
    _mm512_store_ps(shift, _mm512_mul_ps(ref, _mm512_set1_ps(-c)));
    const __m512 vc = _mm512_set1_ps(c), bound = _mm512_set1_ps(kLazyBound);
    alignas(64) float sums[kTileRows][kLanes] = {};  // in memory: the score registers need all 32
    __mmask16 over = 0;
    group_score_dots(q, d2, d, kt, keys, [&](int64_t row, int64_t j, __m512 s0, __m512 s1) {
        // Padding keys (from `valid` on, in the last 32 only) get probability 0.
        const int64_t left = valid - j;
        const __mmask16 m0 = left >= kLanes ? 0xFFFF : left > 0 ? (1u << left) - 1 : 0;
        const __mmask16 m1 = left >= 2 * kLanes ? 0xFFFF : left > kLanes ? (1u << (left - kLanes)) - 1 : 0;
        const __m512 shift_row = _mm512_set1_ps(shift[row]);
        const __m512 t0 = _mm512_fmadd_ps(s0, vc, shift_row);
        const __m512 t1 = _mm512_fmadd_ps(s1, vc, shift_row);
        over |= _mm512_mask_cmp_ps_mask(m0, t0, bound, _CMP_GT_OQ) | _mm512_mask_cmp_ps_mask(m1, t1, bound, _CMP_GT_OQ);
        const __m512 e0 = _mm512_maskz_mov_ps(m0, exp2_bounded(t0));
        const __m512 e1 = _mm512_maskz_mov_ps(m1, exp2_bounded(t1));
        float* sum = sums[row];
        _mm512_store_ps(sum, _mm512_add_ps(_mm512_load_ps(sum), _mm512_add_ps(e0, e1)));
        _mm512_storeu_si512(pb + row * p_row + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    });
    if (over) return false;
    for (int64_t i = 0; i < kTileRows; ++i) row_sum[i] += _mm512_reduce_add_ps(_mm512_load_ps(sums[i]));
    return true;
}

// O[R rows][N blocks of 16 channels] += P (bf16, rows of p_row) · v over `keys` keys (even) from vt.
// With kHalfLast the last block holds 8 channels and padding (SD's heads of 40: 16 + 16 + 8):
// its sums run 256 bits wide, which Zen 4 does in half a 512-bit operation's time. The
// channels summed, and the order they are summed in, are the same.
template <int R, int N, bool kHalfLast = false>
inline void value_dots(const uint16_t* pb, int64_t p_row, const uint16_t* vt, int64_t vecs, int64_t keys, float* o,
                       int64_t dp) {
    constexpr int kFull = kHalfLast ? N - 1 : N;
    __m512 acc[R][N];
    __m256 half[R];
    for (int r = 0; r < R; ++r) {
        for (int i = 0; i < kFull; ++i) acc[r][i] = _mm512_loadu_ps(o + r * dp + i * kLanes);
        if (kHalfLast) half[r] = _mm256_loadu_ps(o + r * dp + kFull * kLanes);
    }
    for (int64_t j = 0; j < keys; j += 2) {
        const uint16_t* v = vt + v_pair(j / 2, vecs);
        __m512bh vv[N];
        for (int i = 0; i < kFull; ++i) vv[i] = load_pairs(v + i * 2 * kLanes);
        __m256bh vh{};
        if (kHalfLast) vh = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + kFull * 2 * kLanes));
        for (int r = 0; r < R; ++r) {
            const __m512bh pr = pair_splat(pb + r * p_row + j);
            for (int i = 0; i < kFull; ++i) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], pr, vv[i]);
            if (kHalfLast) half[r] = _mm256_dpbf16_ps(half[r], (__m256bh)_mm512_castsi512_si256((__m512i)pr), vh);
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int i = 0; i < kFull; ++i) _mm512_storeu_ps(o + r * dp + i * kLanes, acc[r][i]);
        if (kHalfLast) _mm256_storeu_ps(o + r * dp + kFull * kLanes, half[r]);
    }
}

// value_dots for kDotRows rows and N blocks, the last half wide or not.
template <int N>
inline void value_dots_block(bool half, const uint16_t* pb, int64_t p_row, const uint16_t* vt, int64_t vecs,
                             int64_t keys, float* o, int64_t dp) {
    if (half)
        value_dots<kDotRows, N, true>(pb, p_row, vt, vecs, keys, o, dp);
    else
        value_dots<kDotRows, N>(pb, p_row, vt, vecs, keys, o, dp);
}

// Blocks of 3 vectors (SD's heads of 40 channels are 3), the last 4 as 2 + 2 rather than 3 + 1;
// a last block that holds 8 channels or fewer of the head's d runs half wide.
inline void group_values(const uint16_t* pb, int64_t p_row, const uint16_t* vt, int64_t vecs, int64_t d, int64_t keys,
                         float* o, int64_t dp) {
    const bool half_last = d % kLanes != 0 && d % kLanes <= kLanes / 2;
    for (int64_t r = 0; r < kTileRows; r += kDotRows) {
        const uint16_t* pr = pb + r * p_row;
        float* orow = o + r * dp;
        int64_t i = 0;
        for (; vecs - i > 4 || vecs - i == 3; i += 3)
            value_dots_block<3>(half_last && vecs - i == 3, pr, p_row, vt + i * 2 * kLanes, vecs, keys,
                                orow + i * kLanes, dp);
        for (; vecs - i >= 2; i += 2)
            value_dots_block<2>(half_last && vecs - i == 2, pr, p_row, vt + i * 2 * kLanes, vecs, keys,
                                orow + i * kLanes, dp);
        if (i < vecs) value_dots_block<1>(half_last, pr, p_row, vt + i * 2 * kLanes, vecs, keys, orow + i * kLanes, dp);
    }
}

inline void begin_products() {}
inline void end_products() {}
#endif

void attend_bf16(const AttentionProblem& p, int64_t begin, int64_t end) {
    const int64_t m_pad = padded_keys(p.m), dp = padded_width(p.d), per_head = packed_head_floats(p);
    const int64_t d2 = k_pairs(p.d), vecs = dp / kLanes;
    const int64_t tiles = (p.n + kQueryTile - 1) / kQueryTile;
    const int64_t key_tile = std::min(kKeyTile, m_pad);  // a multiple of 32
    const float c = p.scale * 1.44269504088896341f;
    // Scores and probabilities for one group of 16 rows at a time stay in L1.
    std::vector<uint16_t> qt(kQueryTile * 2 * d2), pb(kTileRows * key_tile);
    std::vector<float> s(kTileRows * key_tile), o(kQueryTile * dp);
    std::vector<float> row_max(kQueryTile), row_sum(kQueryTile);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    begin_products();
    for (int64_t task = begin; task < end; ++task) {
        const int64_t bh = task / tiles, b = bh / p.heads, h = bh % p.heads;
        const int64_t row0 = (task % tiles) * kQueryTile;
        const int64_t rows = std::min(kQueryTile, p.n - row0);
        const int64_t rows_pad = (rows + kTileRows - 1) / kTileRows * kTileRows;
        const uint16_t* kt = reinterpret_cast<const uint16_t*>(p.packed + bh * per_head);
        const uint16_t* vp = kt + m_pad * d2 * 2;
        std::fill(qt.begin(), qt.end(), uint16_t{0});
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(&qt[r * 2 * d2], p.q_bf16 + b * p.q_batch + (row0 + r) * p.q_row + h * p.d,
                        sizeof(uint16_t) * p.d);
        std::fill(o.begin(), o.end(), 0.0f);
        std::fill(row_max.begin(), row_max.end(), neg_inf);
        std::fill(row_sum.begin(), row_sum.end(), 0.0f);
        for (int64_t j0 = 0; j0 < m_pad; j0 += key_tile) {
            const int64_t keys = std::min(key_tile, m_pad - j0);  // a multiple of 32
            const int64_t valid = std::min(keys, p.m - j0);
            const uint16_t* vt = vp + v_pair(j0 / 2, vecs);
            for (int64_t r = 0; r < rows_pad; r += kTileRows) {
                const uint16_t* panel = kt + k_panel(j0 / kLanes, d2);
                if (!lazy_softmax_rows(&qt[r * 2 * d2], d2, p.d, panel, keys, valid, c, &row_max[r], &row_sum[r],
                                       pb.data(), key_tile)) {
                    group_scores(&qt[r * 2 * d2], d2, p.d, panel, keys, s.data(), key_tile);
                    alignas(64) float alpha[kTileRows];
                    softmax_rows(s.data(), key_tile, keys, valid, c, &row_max[r], &row_sum[r], pb.data(), alpha);
                    for (int64_t i = 0; i < kTileRows; ++i)
                        if (alpha[i] != 1.0f)
                            for (int64_t ch = 0; ch < dp; ++ch) o[(r + i) * dp + ch] *= alpha[i];
                }
                group_values(pb.data(), key_tile, vt, vecs, p.d, keys, &o[r * dp], dp);
            }
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t oo = b * p.o_batch + (row0 + r) * p.o_row + h * p.d;
            const float inv = 1.0f / row_sum[r];
            for (int64_t ch = 0; ch < p.d; ++ch) p.out_bf16[oo + ch] = float_to_bf16(o[r * dp + ch] * inv);
        }
    }
    end_products();
}
#endif

}  // namespace

void pack(const AttentionProblem& p, int64_t begin, int64_t end) {
#if defined(__AVX512BF16__)
    if (bf16_route(p)) {
        for (int64_t bh = begin; bh < end; ++bh) pack_bf16(p, bh);
        return;
    }
#endif
    const int64_t m_pad = padded_keys(p.m), dp = padded_width(p.d), per_head = packed_head_floats(p);
    for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / p.heads, h = bh % p.heads;
        float* kt = p.packed + bh * per_head;
        float* vp = kt + p.d * m_pad;
        std::fill(kt, kt + per_head, 0.0f);
        std::vector<float> krow(p.k_bf16 ? p.d : 0);
        for (int64_t j = 0; j < p.m; ++j) {
            const int64_t ko = b * p.k_batch + j * p.k_row + h * p.d, vo = b * p.v_batch + j * p.v_row + h * p.d;
            const float* kr = p.k + ko;
            if (p.k_bf16) {
                read_row(krow.data(), nullptr, p.k_bf16 + ko, p.d);
                kr = krow.data();
            }
            float* panel = kt + (j / kKeyAlign) * p.d * kKeyAlign + j % kKeyAlign;
            for (int64_t c = 0; c < p.d; ++c) panel[c * kKeyAlign] = kr[c];
            read_row(vp + j * dp, p.v_bf16 ? nullptr : p.v + vo, p.v_bf16 ? p.v_bf16 + vo : nullptr, p.d);
        }
    }
}

void attend(const AttentionProblem& p, int64_t begin, int64_t end) {
#if defined(__AVX512BF16__)
    if (bf16_route(p)) return attend_bf16(p, begin, end);
#endif
    const int64_t m_pad = padded_keys(p.m), dp = padded_width(p.d), per_head = packed_head_floats(p);
    const int64_t tiles = (p.n + kQueryTile - 1) / kQueryTile;
    const int64_t key_tile = std::min(kKeyTile, m_pad);
    std::vector<float> qt(kQueryTile * p.d), s(kQueryTile * key_tile), o(kQueryTile * dp);
    std::vector<float> row_max(kQueryTile), row_sum(kQueryTile);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t task = begin; task < end; ++task) {
        const int64_t bh = task / tiles, b = bh / p.heads, h = bh % p.heads;
        const int64_t row0 = (task % tiles) * kQueryTile;
        const int64_t rows = std::min(kQueryTile, p.n - row0);
        const int64_t rows_pad = (rows + kWideRows - 1) / kWideRows * kWideRows;
        const float* kt = p.packed + bh * per_head;
        const float* vp = kt + p.d * m_pad;
        std::fill(qt.begin(), qt.end(), 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t qo = b * p.q_batch + (row0 + r) * p.q_row + h * p.d;
            read_row(&qt[r * p.d], p.q_bf16 ? nullptr : p.q + qo, p.q_bf16 ? p.q_bf16 + qo : nullptr, p.d);
        }
        std::fill(o.begin(), o.end(), 0.0f);
        std::fill(row_max.begin(), row_max.end(), neg_inf);
        std::fill(row_sum.begin(), row_sum.end(), 0.0f);
        for (int64_t j0 = 0; j0 < m_pad; j0 += key_tile) {
            const int64_t keys = std::min(key_tile, m_pad - j0);  // a multiple of 2W
            const int64_t valid = std::min(keys, p.m - j0);
            for (int64_t r = 0; r < rows_pad; r += kWideRows)
                for (int64_t j = 0; j < keys; j += 2 * W) {
                    const int64_t key = j0 + j;
                    const float* panel = kt + (key / kKeyAlign) * p.d * kKeyAlign + key % kKeyAlign;
                    score_block<kWideRows>(&qt[r * p.d], p.d, panel, p.scale, &s[r * key_tile + j], key_tile);
                }
            for (int64_t r = 0; r < rows_pad; ++r) {
                float* sr = &s[r * key_tile];
                std::fill(sr + valid, sr + keys, neg_inf);  // padding keys take no weight
                Vec mv = splat(neg_inf);
                for (int64_t j = 0; j < keys; j += W) mv = vmax(mv, load(sr + j));
                const float new_max = std::max(row_max[r], hmax(mv));
                // Rescale what earlier key tiles gave this row to the new maximum.
                const float alpha = row_max[r] == neg_inf ? 0.0f : std::exp(row_max[r] - new_max);
                row_max[r] = new_max;
                Vec sum = Vec{};
                const Vec mx = splat(new_max);
                for (int64_t j = 0; j < keys; j += W) {
                    const Vec e = exp_nonpositive(load(sr + j) - mx);
                    store(sr + j, e);
                    sum += e;
                }
                row_sum[r] = row_sum[r] * alpha + hsum(sum);
                if (alpha != 1.0f)
                    for (int64_t c = 0; c < dp; ++c) o[r * dp + c] *= alpha;
            }
            for (int64_t r = 0; r < rows_pad; r += kWideRows)
                values_wide(&s[r * key_tile], key_tile, vp + j0 * dp, dp, p.d, valid, &o[r * dp]);
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t oo = b * p.o_batch + (row0 + r) * p.o_row + h * p.d;
            const float inv = 1.0f / row_sum[r];
            if (p.out_bf16)
                for (int64_t c = 0; c < p.d; ++c) p.out_bf16[oo + c] = float_to_bf16(o[r * dp + c] * inv);
            else
                for (int64_t c = 0; c < p.d; ++c) p.out[oo + c] = o[r * dp + c] * inv;
        }
    }
}

}  // namespace sd::kernels::SD_ISA
