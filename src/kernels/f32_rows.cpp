#include "kernels/f32_rows.h"

#include <cstring>

#include "kernels/attention_kernel.h"
#include "kernels/row_math.h"

namespace sd::kernels {

namespace {

using namespace rows;

// Loads and stores of a float vector V at any float address.
template <class V>
SD_INLINE V load(const float* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <class V>
SD_INLINE void store(float* p, V v) {
    std::memcpy(p, &v, sizeof v);
}

template <class V>
SD_INLINE void geglu_rows(const float* in, const float* bias, float* out, int64_t width, int64_t begin, int64_t end) {
    constexpr int64_t W = sizeof(V) / sizeof(float);
    for (int64_t r = begin; r < end; ++r) {
        const float* x = in + r * 2 * width;
        const float* g = x + width;
        float* y = out + r * width;
        int64_t c = 0;
        for (; c + W <= width; c += W) {
            V a = load<V>(x + c), b = load<V>(g + c);
            if (bias) {
                a += load<V>(bias + c);
                b += load<V>(bias + width + c);
            }
            store(y + c, a * gelu(b));
        }
        if (c < width) {  // the last partial vector through a padded copy
            const int64_t n = width - c;
            float xs[W] = {}, gs[W] = {}, ys[W];
            std::memcpy(xs, x + c, sizeof(float) * n);
            std::memcpy(gs, g + c, sizeof(float) * n);
            V a = load<V>(xs), b = load<V>(gs);
            if (bias) {
                float xb[W] = {}, gb[W] = {};
                std::memcpy(xb, bias + c, sizeof(float) * n);
                std::memcpy(gb, bias + width + c, sizeof(float) * n);
                a += load<V>(xb);
                b += load<V>(gb);
            }
            store(ys, a * gelu(b));
            std::memcpy(y + c, ys, sizeof(float) * n);
        }
    }
}

// Each build's own vector width: 16 floats for AVX-512, 8 for AVX2, 4 for the baseline.
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec4 __attribute__((vector_size(16)));

// One build per instruction set.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SD_TARGET(isa) __attribute__((target(isa)))
#else
#define SD_TARGET(isa)
#endif

SD_TARGET("avx512f,avx512dq,avx512vl,avx2,fma")
void geglu_avx512(const float* in, const float* bias, float* out, int64_t width, int64_t begin, int64_t end) {
    geglu_rows<Vec>(in, bias, out, width, begin, end);
}
SD_TARGET("avx2,fma")
void geglu_avx2(const float* in, const float* bias, float* out, int64_t width, int64_t begin, int64_t end) {
    geglu_rows<Vec8>(in, bias, out, width, begin, end);
}
void geglu_baseline(const float* in, const float* bias, float* out, int64_t width, int64_t begin, int64_t end) {
    geglu_rows<Vec4>(in, bias, out, width, begin, end);
}

const F32RowKernels kKernels[] = {{"avx512", geglu_avx512}, {"avx2", geglu_avx2}, {"baseline", geglu_baseline}};

}  // namespace

// The same three builds as the attention kernel, with the same instruction sets: its CPU check and
// its choice (SD_ATTENTION_ISA, and the warning for a build this CPU lacks) serve both.
const F32RowKernels* f32_row_kernels_named(const char* name) {
    if (!attention_kernel_named(name)) return nullptr;  // unknown, or this CPU cannot run it
    // The attention kernel's AVX-512 builds with bf16 products.
    if (std::strcmp(name, "amx") == 0 || std::strcmp(name, "avx512bf16") == 0) name = "avx512";
    for (const auto& k : kKernels)
        if (std::strcmp(name, k.name) == 0) return &k;
    return nullptr;
}

const F32RowKernels& f32_row_kernels() {
    static const F32RowKernels* chosen = f32_row_kernels_named(attention_kernel().name);
    return *chosen;
}

}  // namespace sd::kernels
