#include "kernels/pointwise_bf16.h"

#include "kernels/linear_kernel.h"
#include "kernels/winograd_bf16.h"

#include <algorithm>

#if SD_HAVE_DNNL
#include <immintrin.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <tuple>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/dnnl_engine.h"
#endif

namespace sd::kernels {

bool pointwise_bf16_available() { return winograd_bf16_available(); }

// Columns (pixels) per product: the fp32 sums of one chunk stay at most 16 MiB, kept from
// call to call (fresh pages cost more than the product here). A whole image's columns (the
// UNet's layers, the VAE's at 64²) run oneDNN's brgemm kernel, a part of them (strided) its
// older gemm, still 2-3x the convolution at the VAE's larger sizes.
constexpr int64_t kSumFloats = 4 << 20;

int64_t pointwise_bf16_chunk_columns(int64_t oc, int64_t hw) {
    return std::min(hw, std::max<int64_t>(256, kSumFloats / std::max<int64_t>(oc, 1)));
}

int64_t pointwise_bf16_scratch_bytes() { return pointwise_bf16_available() ? kSumFloats * 4 : 0; }

#if SD_HAVE_DNNL

namespace {

struct Product {
    dnnl::matmul mm;
    dnnl::memory::desc w, x, y;
};

std::shared_ptr<const Product> product_for(int64_t oc, int64_t ic, int64_t cols, int64_t hw) {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    static PrimitiveCache<std::tuple<int64_t, int64_t, int64_t, int64_t>, Product> cache;
    return cache.get({oc, ic, cols, hw}, [&] {
        auto p = std::make_shared<Product>();
        p->w = md({oc, ic}, dt::bf16, dnnl::memory::format_tag::ab);
        p->x = md({ic, cols}, dt::bf16, dnnl::memory::dims{hw, 1});
        p->y = md({oc, cols}, dt::f32, dnnl::memory::format_tag::ab);
        p->mm = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(p->w, p->x, p->y), dnnl_cpu_engine()));
        return p;
    });
}

// y's columns [j, j + cols) of every row o: the sums plus the bias, rounded once.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void finish(const float* sums, int64_t oc, int64_t cols,
                                                                            const float* b, uint16_t* y, int64_t hw) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < oc; ++o) {
        const float* s = sums + o * cols;
        uint16_t* out = y + o * hw;
        const __m512 bias = _mm512_set1_ps(b[o]);
        for (int64_t c = 0; c < cols; c += 16) {
            const __mmask16 m = cols - c >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (cols - c)) - 1);
            const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, s + c), bias);
            _mm256_mask_storeu_epi16(out + c, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
        }
    }
}

}  // namespace

bool pointwise_bf16(const uint16_t* x, int64_t n, int64_t ic, int64_t hw, const uint16_t* w, int64_t oc,
                    const uint16_t* bias, uint16_t* y) {
    if (!pointwise_bf16_available() || n < 1 || ic < 1 || oc < 1 || hw < 1) return false;
    const int64_t cols = pointwise_bf16_chunk_columns(oc, hw);
    std::vector<float> b(oc, 0.0f);
    thread_local std::vector<float> sums;
    if (static_cast<int64_t>(sums.size()) < oc * cols) sums.resize(oc * cols);
    if (bias)
        for (int64_t o = 0; o < oc; ++o) b[o] = bf16_to_float(bias[o]);
    try {
        auto& eng = dnnl_cpu_engine();
        dnnl::stream stream(eng);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < hw; j += cols) {
                const int64_t count = std::min(cols, hw - j);
                const auto p = product_for(oc, ic, count, hw);
                dnnl::memory wm(p->w, eng, const_cast<uint16_t*>(w)), ym(p->y, eng, sums.data());
                dnnl::memory xm(p->x, eng, const_cast<uint16_t*>(x + i * ic * hw + j));
                p->mm.execute(stream, {{DNNL_ARG_SRC, wm}, {DNNL_ARG_WEIGHTS, xm}, {DNNL_ARG_DST, ym}});
                stream.wait();
                finish(sums.data(), oc, count, b.data(), y + i * oc * hw + j, hw);
            }
    } catch (const dnnl::error&) {
        return false;
    }
    return true;
}

#else

bool pointwise_bf16(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, uint16_t*) {
    return false;
}

#endif

}  // namespace sd::kernels
