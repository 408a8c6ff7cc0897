#include "kernels/winograd_bf16.h"

#include "kernels/linear_kernel.h"

#if SD_HAVE_DNNL && defined(__x86_64__)
#include <immintrin.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/dnnl_engine.h"
#endif

namespace sd::kernels {

#if SD_HAVE_DNNL && defined(__x86_64__)

namespace {

// Scratch per chunk of tile rows: V [16][ic][tiles] bf16 and M [16][oc][tiles] fp32.
// The products want a few hundred tiles (fewer ran at half speed); more spill the
// chunk out of the cache before its output transform reads it (bench/winograd_bf16.cpp).
constexpr int64_t kChunkTiles = 512;
constexpr int64_t kChunkBytes = 32 << 20;

#define SD_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

SD_BF16_TARGET inline __m512 bf16_low(__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }
SD_BF16_TARGET inline __m512 bf16_high(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
SD_BF16_TARGET inline void store_bf16(uint16_t* p, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// The 3x3 weights of up to 16 input channels ([16][3][3], 144 values) in five vectors of 32
// values, zero past `count` channels (masked loads: nothing read past them).
struct WeightBlock {
    __m512i v[5];
};
SD_BF16_TARGET inline WeightBlock load_block(const uint16_t* g, int64_t count) {
    const int64_t n = count * 9;
    WeightBlock b;
    for (int r = 0; r < 5; ++r) {
        const int64_t left = std::clamp<int64_t>(n - 32 * r, 0, 32);
        const __mmask32 m = left == 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1);
        b.v[r] = _mm512_maskz_loadu_epi16(m, g + 32 * r);
    }
    return b;
}

// Where tap t of channel k sits in a block: value 9k + t, in vector (9k + t) / 32 of five,
// moved into the high half of 32-bit lane k (a bf16 value's bits are a float's top half).
// One permutation picks it from the pair of vectors 0-1, one from 2-3, one from 4: the
// index of each (modulo 64) and which lanes each fills.
struct TapPicks {
    alignas(64) uint16_t index[9][32] = {};
    __mmask32 from01[9] = {}, from23[9] = {}, from4[9] = {};
    TapPicks() {
        for (int t = 0; t < 9; ++t)
            for (int k = 0; k < 16; ++k) {
                const int at = 9 * k + t;
                index[t][2 * k + 1] = static_cast<uint16_t>(at % 64);
                (at < 64 ? from01 : at < 128 ? from23 : from4)[t] |= __mmask32{1} << (2 * k + 1);
            }
    }
};
const TapPicks kTapPicks;

// Tap t of the block's 16 channels as floats, the low halves zero.
SD_BF16_TARGET inline __m512 block_tap(const WeightBlock& b, int t) {
    const __m512i i = _mm512_load_si512(kTapPicks.index[t]);
    const __m512i a = _mm512_maskz_permutex2var_epi16(kTapPicks.from01[t], b.v[0], i, b.v[1]);
    const __m512i c = _mm512_maskz_permutex2var_epi16(kTapPicks.from23[t], b.v[2], i, b.v[3]);
    const __m512i e = _mm512_maskz_permutexvar_epi16(kTapPicks.from4[t], i, b.v[4]);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_or_si512(a, c), e));
}

// U = G g Gᵀ for every (out, in) pair, into u [16][oc][ic]: 16 input channels at a
// time.
SD_BF16_TARGET void transform_weights(const uint16_t* weight, int64_t oc, int64_t ic, uint16_t* u) {
    const int64_t plane = oc * ic;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < oc; ++o) {
        for (int64_t i = 0; i < ic; i += 16) {
            const int64_t count = std::min<int64_t>(16, ic - i);
            const __mmask16 m = static_cast<__mmask16>((1u << count) - 1);
            const WeightBlock g = load_block(weight + (o * ic + i) * 9, count);
            const __m512 half = _mm512_set1_ps(0.5f);
            __m512 r[3][4];  // each row of g transformed: r[row][q]
            for (int row = 0; row < 3; ++row) {
                const __m512 g0 = block_tap(g, row * 3), g1 = block_tap(g, row * 3 + 1), g2 = block_tap(g, row * 3 + 2);
                const __m512 ends = _mm512_add_ps(g0, g2);
                r[row][0] = g0;
                r[row][1] = _mm512_mul_ps(half, _mm512_add_ps(ends, g1));
                r[row][2] = _mm512_mul_ps(half, _mm512_sub_ps(ends, g1));
                r[row][3] = g2;
            }
            uint16_t* out = u + o * ic + i;
            for (int q = 0; q < 4; ++q) {
                const __m512 ends = _mm512_add_ps(r[0][q], r[2][q]);
                store_bf16(out + (0 * 4 + q) * plane, r[0][q], m);
                store_bf16(out + (1 * 4 + q) * plane, _mm512_mul_ps(half, _mm512_add_ps(ends, r[1][q])), m);
                store_bf16(out + (2 * 4 + q) * plane, _mm512_mul_ps(half, _mm512_sub_ps(ends, r[1][q])), m);
                store_bf16(out + (3 * 4 + q) * plane, r[2][q], m);
            }
        }
    }
}

// Bᵀ d along one input row for `count` (≤ 16) tiles from tile `j`: h[q] for q = 0..3.
// b points at the row's first pixel, with a zero before it and after its last.
SD_BF16_TARGET inline void row_transform(const uint16_t* b, int64_t j, __mmask16 m, __m512 h[4]) {
    const __m512i here = _mm512_maskz_loadu_epi32(m, b + 2 * j);        // b[2j], b[2j+1]
    const __m512i before = _mm512_maskz_loadu_epi32(m, b + 2 * j - 1);  // b[2j-1], b[2j]
    const __m512i after = _mm512_maskz_loadu_epi32(m, b + 2 * j + 1);   // b[2j+1], b[2j+2]
    const __m512 d0 = bf16_low(before), d1 = bf16_low(here), d2 = bf16_high(here), d3 = bf16_high(after);
    h[0] = _mm512_sub_ps(d0, d2);
    h[1] = _mm512_add_ps(d1, d2);
    h[2] = _mm512_sub_ps(d2, d1);
    h[3] = _mm512_sub_ps(d1, d3);
}

struct Chunk {
    int64_t h, w, across;  // the images' size, tiles in a row
    int64_t row0, rows;    // tile rows (counted over every image) in this chunk
    int64_t tiles() const { return rows * across; }
};

// V = Bᵀ d B for the chunk's tiles of channel c, into v [16][ic][tiles].
SD_BF16_TARGET void transform_input(const uint16_t* x, int64_t ic, int64_t c, const Chunk& k, uint16_t* row_buf,
                                    uint16_t* v) {
    const int64_t tiles = k.tiles(), tile_rows = k.h / 2, stride = ic * tiles;
    const int64_t row_len = k.w + 2;  // row_buf: four rows of w + 2 values, zero at both ends
    for (int64_t r = 0; r < k.rows; ++r) {
        const int64_t image = (k.row0 + r) / tile_rows, ti = (k.row0 + r) % tile_rows;
        const uint16_t* plane = x + (image * ic + c) * k.h * k.w;
        bool inside[4];
        for (int row = 0; row < 4; ++row) {  // input rows 2ti-1 .. 2ti+2
            const int64_t y = 2 * ti - 1 + row;
            inside[row] = y >= 0 && y < k.h;
            if (inside[row]) std::memcpy(row_buf + row * row_len + 1, plane + y * k.w, k.w * sizeof(uint16_t));
        }
        for (int64_t j = 0; j < k.across; j += 16) {
            const int64_t count = std::min<int64_t>(16, k.across - j);
            const __mmask16 m = static_cast<__mmask16>((1u << count) - 1);
            __m512 h[4][4];  // each input row transformed
            for (int row = 0; row < 4; ++row) {
                if (inside[row])
                    row_transform(row_buf + row * row_len + 1, j, m, h[row]);
                else
                    for (int q = 0; q < 4; ++q) h[row][q] = _mm512_setzero_ps();
            }
            uint16_t* out = v + c * tiles + r * k.across + j;
            for (int q = 0; q < 4; ++q) {
                store_bf16(out + (0 * 4 + q) * stride, _mm512_sub_ps(h[0][q], h[2][q]), m);
                store_bf16(out + (1 * 4 + q) * stride, _mm512_add_ps(h[1][q], h[2][q]), m);
                store_bf16(out + (2 * 4 + q) * stride, _mm512_sub_ps(h[2][q], h[1][q]), m);
                store_bf16(out + (3 * 4 + q) * stride, _mm512_sub_ps(h[1][q], h[3][q]), m);
            }
        }
    }
}

// Y = Aᵀ M A + bias for the chunk's tiles of output channel o, from m [16][oc][tiles].
SD_BF16_TARGET void transform_output(const float* mm, int64_t oc, int64_t o, float bias, const Chunk& k, uint16_t* y) {
    const int64_t tiles = k.tiles(), tile_rows = k.h / 2, stride = oc * tiles;
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512 vb = _mm512_set1_ps(bias);
    for (int64_t r = 0; r < k.rows; ++r) {
        const int64_t image = (k.row0 + r) / tile_rows, ti = (k.row0 + r) % tile_rows;
        uint16_t* plane = y + (image * oc + o) * k.h * k.w;
        for (int64_t j = 0; j < k.across; j += 16) {
            const int64_t count = std::min<int64_t>(16, k.across - j);
            const __mmask16 m = static_cast<__mmask16>((1u << count) - 1);
            const float* in = mm + o * tiles + r * k.across + j;
            __m512 s[4][2];  // each row p of M transformed: s[p][b]
            for (int p = 0; p < 4; ++p) {
                const __m512 m0 = _mm512_maskz_loadu_ps(m, in + (p * 4 + 0) * stride);
                const __m512 m1 = _mm512_maskz_loadu_ps(m, in + (p * 4 + 1) * stride);
                const __m512 m2 = _mm512_maskz_loadu_ps(m, in + (p * 4 + 2) * stride);
                const __m512 m3 = _mm512_maskz_loadu_ps(m, in + (p * 4 + 3) * stride);
                s[p][0] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
                s[p][1] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
            }
            const int64_t first = 2 * count < 16 ? 2 * count : 16, second = 2 * count - first;
            const __mmask16 m_first = static_cast<__mmask16>((1u << first) - 1);
            const __mmask16 m_second = static_cast<__mmask16>((1u << second) - 1);
            for (int a = 0; a < 2; ++a) {
                const __m512 y0 = a == 0 ? _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[0][0], s[1][0]), s[2][0]), vb)
                                         : _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s[1][0], s[2][0]), s[3][0]), vb);
                const __m512 y1 = a == 0 ? _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[0][1], s[1][1]), s[2][1]), vb)
                                         : _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s[1][1], s[2][1]), s[3][1]), vb);
                uint16_t* row = plane + (2 * ti + a) * k.w + 2 * j;
                store_bf16(row, _mm512_permutex2var_ps(y0, lo, y1), m_first);
                if (second > 0) store_bf16(row + 16, _mm512_permutex2var_ps(y0, hi, y1), m_second);
            }
        }
    }
}

// The 16 products M = U V of a chunk: [16, oc, ic] x [16, ic, tiles] -> [16, oc, tiles].
struct Products {
    dnnl::matmul mm;
    dnnl::memory::desc u, v, m;
};

std::shared_ptr<const Products> products_for(int64_t oc, int64_t ic, int64_t tiles) {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    static PrimitiveCache<std::tuple<int64_t, int64_t, int64_t>, Products> cache;
    return cache.get({oc, ic, tiles}, [&] {
        auto p = std::make_shared<Products>();
        p->u = md({16, oc, ic}, dt::bf16, tag::abc);
        p->v = md({16, ic, tiles}, dt::bf16, tag::abc);
        p->m = md({16, oc, tiles}, dt::f32, tag::abc);
        p->mm = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(p->u, p->v, p->m), dnnl_cpu_engine()));
        return p;
    });
}

template <typename T>
void grow(std::vector<T>& buffer, int64_t size) {
    if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(size);
}

int64_t rows_per_chunk(int64_t ic, int64_t oc, int64_t across) {
    const int64_t by_tiles = kChunkTiles / across, by_bytes = kChunkBytes / (across * 16 * (ic * 2 + oc * 4));
    return std::max<int64_t>(1, std::min(by_tiles, by_bytes));
}

}  // namespace

bool winograd_bf16_available() {
    // With AMX oneDNN's direct bf16 convolution runs near 2x faster than its matmul does
    // here, and the route was never measured there: AMX keeps the direct one.
    return cpu_has_bf16() && !cpu_has_amx();
}

bool winograd_bf16_runs(int64_t n, int64_t ic, int64_t oc, int64_t h, int64_t w) {
    if (!winograd_bf16_available() || h % 2 || w % 2 || ic < 64 || oc < 64) return false;
    // Below 16x16 pixels the products are too small for the transforms to pay.
    return n >= 1 && h * w >= 16 * 16;
}

namespace {

// The scratch, kept from call to call (fresh pages cost more than the transforms: the
// kernel zeroes them) until winograd_bf16_release; one call at a time uses it.
struct Scratch {
    std::mutex mu;
    std::vector<uint16_t> u, v;
    std::vector<float> m;
};

Scratch& scratch() {
    static Scratch s;
    return s;
}

}  // namespace

int64_t winograd_bf16_scratch_bytes(int64_t weight_values) {
    // U at 16 values for 9, and a chunk (whole rows of tiles: a row of up to 4096 pixels fits).
    return weight_values * 16 / 9 * 2 + kChunkBytes;
}

void winograd_bf16_release() {
    Scratch& s = scratch();
    std::lock_guard<std::mutex> lock(s.mu);
    s.u = {}, s.v = {}, s.m = {};
}

bool winograd_bf16_conv3x3(const uint16_t* x, int64_t n, int64_t ic, int64_t h, int64_t w, const uint16_t* weight,
                           int64_t oc, const uint16_t* bias, uint16_t* y) {
    const int64_t across = w / 2, total_rows = n * (h / 2);
    const int64_t per_chunk = std::min(total_rows, rows_per_chunk(ic, oc, across));
    const int64_t chunks = (total_rows + per_chunk - 1) / per_chunk;
    const int64_t rows = (total_rows + chunks - 1) / chunks;  // even chunks: fewer primitives
    Scratch& s = scratch();
    std::lock_guard<std::mutex> lock(s.mu);
    grow(s.u, 16 * oc * ic);
    grow(s.v, 16 * ic * rows * across);
    grow(s.m, 16 * oc * rows * across);
    uint16_t* const up = s.u.data();
    uint16_t* const vp = s.v.data();
    float* const mp = s.m.data();
    std::vector<float> b(oc, 0.0f);
    if (bias)
        for (int64_t o = 0; o < oc; ++o) b[o] = bf16_to_float(bias[o]);
    transform_weights(weight, oc, ic, up);
    try {
        auto& eng = dnnl_cpu_engine();
        dnnl::stream stream(eng);
        for (int64_t row0 = 0; row0 < total_rows; row0 += rows) {
            const Chunk k{h, w, across, row0, std::min(rows, total_rows - row0)};
            const auto p = products_for(oc, ic, k.tiles());
#pragma omp parallel
            {
                std::vector<uint16_t> row_buf(4 * (w + 2), 0);
#pragma omp for schedule(static)
                for (int64_t c = 0; c < ic; ++c) transform_input(x, ic, c, k, row_buf.data(), vp);
            }
            dnnl::memory um(p->u, eng, up), vm(p->v, eng, vp), mm(p->m, eng, mp);
            p->mm.execute(stream, {{DNNL_ARG_SRC, um}, {DNNL_ARG_WEIGHTS, vm}, {DNNL_ARG_DST, mm}});
            stream.wait();
#pragma omp parallel for schedule(static)
            for (int64_t o = 0; o < oc; ++o) transform_output(mp, oc, o, b[o], k, y);
        }
    } catch (const dnnl::error&) {
        return false;
    }
    return true;
}

#else

bool winograd_bf16_available() { return false; }
bool winograd_bf16_runs(int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
int64_t winograd_bf16_scratch_bytes(int64_t) { return 0; }
void winograd_bf16_release() {}
bool winograd_bf16_conv3x3(const uint16_t*, int64_t, int64_t, int64_t, int64_t, const uint16_t*, int64_t,
                           const uint16_t*, uint16_t*) {
    return false;
}

#endif

}  // namespace sd::kernels
