#include "kernels/blocked_kernel.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if SD_HAVE_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/dnnl_engine.h"
#endif

namespace sd::kernels {

// Each instruction-set build of blocked_kernel_isa.cpp defines one.
namespace avx512 {
extern const BlockedKernel kBlockedKernel;
}
namespace avx2 {
extern const BlockedKernel kBlockedKernel;
}

namespace {

bool cpu_runs(const BlockedKernel& k) {
#if defined(__x86_64__) && SD_HAVE_DNNL
    __builtin_cpu_init();
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    auto dnnl_has = [isa](dnnl::cpu_isa want) {
        return (isa & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
    };
    // oneDNN's fast convolutions on nChw16c need AVX-512, on nChw8c AVX2.
    if (k.block == 16)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl") && dnnl_has(dnnl::cpu_isa::avx512_core);
    if (k.block == 8)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && dnnl_has(dnnl::cpu_isa::avx2);
    return false;
#else
    (void)k;
    return false;  // other CPUs keep the plain route
#endif
}

const BlockedKernel* const kKernels[] = {&avx512::kBlockedKernel, &avx2::kBlockedKernel};

}  // namespace

const BlockedKernel* blocked_kernel_named(const char* name) {
    for (const auto* k : kKernels)
        if (std::strcmp(name, k->name) == 0) return cpu_runs(*k) ? k : nullptr;
    return nullptr;
}

std::string blocked_isa_problem() {
    const char* want = std::getenv("SD_BLOCKED_ISA");
    if (!want || !*want || std::strcmp(want, "none") == 0) return "";
    for (const auto* k : kKernels)
        if (std::strcmp(want, k->name) == 0) return "";
    return std::string("SD_BLOCKED_ISA=") + want + " names no blocked-layout build (it takes avx512, avx2 or none)";
}

const BlockedKernel* blocked_kernel() {
    static const BlockedKernel* chosen = [] {
        const char* want = std::getenv("SD_BLOCKED_ISA");
        if (want && std::strcmp(want, "none") == 0) return static_cast<const BlockedKernel*>(nullptr);
        if (want && *want) {
            if (const BlockedKernel* k = blocked_kernel_named(want)) return k;
            // An unknown name was refused before the run (blocked_isa_problem); a known one this
            // CPU or DNNL_MAX_CPU_ISA rules out is a setting made for another machine: go on.
            std::fprintf(stderr,
                         "sd-txt2img: warning: SD_BLOCKED_ISA=%s: this CPU or build cannot run it; using "
                         "the widest it runs\n",
                         want);
        }
        for (const auto* k : kKernels)
            if (cpu_runs(*k)) return k;
        return static_cast<const BlockedKernel*>(nullptr);
    }();
    return chosen;
}

int64_t packed_conv_weight_floats(int64_t oc, int64_t ic, int64_t kh, int64_t kw, int block) {
    const int64_t ob = (oc + block - 1) / block, ib = (ic + block - 1) / block;
    return ob * ib * kh * kw * block * block;
}

#if SD_HAVE_DNNL

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

tag act_tag(int block) { return block == 16 ? tag::nChw16c : tag::nChw8c; }
tag weight_tag(int block) { return block == 16 ? tag::OIhw16i16o : tag::OIhw8i8o; }

// A convolution on blocked activations, weights as `wei` describes them; with
// accumulate, dst's values are added (oneDNN's sum post-op). Throws dnnl::error
// where oneDNN has no implementation.
dnnl::convolution_forward::primitive_desc conv_pd(const ConvShape& s, dnnl::algorithm alg,
                                                  const dnnl::memory::desc& wei, bool with_bias, bool accumulate) {
    const dnnl::memory::desc src({s.n, s.ic, s.ih, s.iw}, dt::f32, act_tag(s.block));
    const dnnl::memory::desc dst({s.n, s.oc, s.oh(), s.ow()}, dt::f32, act_tag(s.block));
    const dnnl::memory::desc bias({s.oc}, dt::f32, tag::a);
    const dnnl::memory::dims strides{s.stride, s.stride}, pad_l{s.pad_top, s.pad_left},
        pad_r{s.pad_bottom, s.pad_right};
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto d = with_bias ? dnnl::convolution_forward::desc(prop, alg, src, wei, bias, dst, strides, pad_l, pad_r)
                             : dnnl::convolution_forward::desc(prop, alg, src, wei, dst, strides, pad_l, pad_r);
    dnnl::primitive_attr attr;
    if (accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
    }
    return dnnl::convolution_forward::primitive_desc(d, attr, dnnl_cpu_engine());
}

std::shared_ptr<const dnnl::convolution_forward> conv_primitive(const ConvShape& s, bool with_bias, bool accumulate) {
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int, bool, bool>;
    static PrimitiveCache<Key, dnnl::convolution_forward> cache;
    const Key key{s.n,       s.ic,       s.oc,         s.ih,        s.iw,    s.kh,      s.kw,      s.stride,
                  s.pad_top, s.pad_left, s.pad_bottom, s.pad_right, s.block, with_bias, accumulate};
    return cache.get(key, [&] {
        const dnnl::memory::desc wei({s.oc, s.ic, s.kh, s.kw}, dt::f32, weight_tag(s.block));
        return std::make_shared<const dnnl::convolution_forward>(
            conv_pd(s, dnnl::algorithm::convolution_direct, wei, with_bias, accumulate));
    });
}

void reorder(const dnnl::memory::desc& from, const float* x, const dnnl::memory::desc& to, float* y) {
    auto& eng = dnnl_cpu_engine();
    dnnl::memory src(from, eng, const_cast<float*>(x)), dst(to, eng, y);
    dnnl::stream s(eng);
    dnnl::reorder(src, dst).execute(s, src, dst);
    s.wait();
}

// A Winograd slot begins with this header: the problem its weights were transformed
// for (n 0: none yet), and the slot's length.
struct WinogradHeader {
    uint64_t magic;
    int64_t n, ic, oc, ih, iw, block, floats;
};
constexpr uint64_t kWinogradMagic = 0x31304f4e49574453ull;  // "SDWINO01" in memory order
constexpr int64_t kHeaderFloats = 16;                       // 64 bytes: the weights after it stay aligned
static_assert(sizeof(WinogradHeader) <= kHeaderFloats * sizeof(float), "header too large");

WinogradHeader header_of(const float* slot) {
    WinogradHeader h;
    std::memcpy(&h, slot, sizeof h);
    return h;
}

struct WinogradPrimitive {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
};

// oneDNN's Winograd convolution for s, or null where it has none (not 3x3 stride 1
// padding 1, block 8, a CPU without AVX-512). Its weights are laid out as oneDNN likes
// them for s with bias and no sum, the layout slots are made in; or, without
// slot_layout, for s as it is: the layout can change with the bias and sum too.
std::shared_ptr<const WinogradPrimitive> winograd_primitive(const ConvShape& s, bool with_bias, bool accumulate,
                                                            bool slot_layout = false) {
    if (s.kh != 3 || s.kw != 3 || s.stride != 1 || s.pad_top != 1 || s.pad_left != 1 || s.pad_bottom != 1 ||
        s.pad_right != 1 || s.block != 16)
        return nullptr;
    std::shared_ptr<const WinogradPrimitive> layout;
    if (slot_layout) {
        layout = winograd_primitive(s, true, false);
        if (!layout) return nullptr;
    }
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool>;
    static PrimitiveCache<Key, WinogradPrimitive> cache;
    return cache.get(
        Key{s.n, s.ic, s.oc, s.ih, s.iw, with_bias, accumulate, slot_layout},
        [&]() -> std::shared_ptr<const WinogradPrimitive> {
            const dnnl::memory::desc wei =
                layout ? layout->pd.weights_desc() : dnnl::memory::desc({s.oc, s.ic, 3, 3}, dt::f32, tag::any);
            try {
                const auto pd = conv_pd(s, dnnl::algorithm::convolution_winograd, wei, with_bias, accumulate);
                return std::make_shared<const WinogradPrimitive>(WinogradPrimitive{pd, dnnl::convolution_forward(pd)});
            } catch (const dnnl::error&) {
                return nullptr;  // unimplemented for this shape or CPU: the direct convolution runs
            }
        });
}

// oneDNN's F(4x4, 3x3) weights (its OBaaIBOIio layout, 16-channel blocks): U = G g Gᵀ
// for each output and input channel, laid out as [oc chunk][6][6][ic chunk][oc2 block]
// [ic2 block][16 inputs][16 outputs], from the weight as pack_conv_weights packed it
// (OIhw16i16o: a block's 16 outputs side by side, which go through the vector lanes
// together). oneDNN's own reorder does the same at ~20 ns a weight (1 s for the UNet's
// second level). G's rows are Lagrange's for the points oneDNN's 4x3 kernels interpolate
// at (0, 5/8, -5/8, 3/2, -3/2, then infinity): c (1, x, x²) with c = 1 / prod over the
// other finite points (x - x'), and (0, 0, 1); its kernels' input and output transforms
// expect this G.
__attribute__((target("avx512f"))) void winograd_4x3_weights(const float* packed, const dnnl_wino_desc_t& d,
                                                             float* out) {
    constexpr int L = 16, A = 6;
    static const auto G = [] {
        const double x[A - 1] = {0.0, 0.625, -0.625, 1.5, -1.5};
        std::array<std::array<float, 3>, A> g{};
        for (int i = 0; i < A - 1; ++i) {
            double prod = 1.0;
            for (int j = 0; j < A - 1; ++j)
                if (j != i) prod *= x[i] - x[j];
            g[i] = {static_cast<float>(1.0 / prod), static_cast<float>(x[i] / prod),
                    static_cast<float>(x[i] * x[i] / prod)};
        }
        g[A - 1] = {0.0f, 0.0f, 1.0f};
        return g;
    }();
    const int64_t nb_oc = d.oc / L, nb_ic = d.ic / L;
    const int64_t ic_chunks = nb_ic / d.ic2_block;
    // Output blocks write disjoint parts of the slot. Every thread then also takes
    // its share of the slot's first touch of fresh pages, most of a load's time on
    // some VMs.
#pragma omp parallel for schedule(static)
    for (int64_t ocb = 0; ocb < nb_oc; ++ocb) {
        const int64_t occ = ocb / d.oc2_block, ob2 = ocb % d.oc2_block;
        for (int64_t icp = 0; icp < d.ic; ++icp) {
            const int64_t icc = icp / (L * d.ic2_block), ib2 = (icp / L) % d.ic2_block, i = icp % L;
            const float* g = packed + (ocb * nb_ic + icp / L) * 9 * L * L + i * L;  // + k * L * L: tap k's 16 outputs
            float t[3][A][L];
            for (int k = 0; k < 3; ++k)
                for (int j = 0; j < A; ++j)
                    for (int o = 0; o < L; ++o)
                        t[k][j][o] = g[(3 * k) * L * L + o] * G[j][0] + g[(3 * k + 1) * L * L + o] * G[j][1] +
                                     g[(3 * k + 2) * L * L + o] * G[j][2];
            for (int a = 0; a < A; ++a)
                for (int b = 0; b < A; ++b) {
                    const int64_t chunk = ((occ * A + a) * A + b) * ic_chunks + icc;
                    float* u = out + (((chunk * d.oc2_block + ob2) * d.ic2_block + ib2) * L + i) * L;
                    for (int o = 0; o < L; ++o)
                        u[o] = G[a][0] * t[0][b][o] + G[a][1] * t[1][b][o] + G[a][2] * t[2][b][o];
                }
        }
    }
}

// Transforms the packed weight into the slot for problem s (oneDNN's layout for s,
// bias and no sum). False, and the slot marked empty, where oneDNN has no Winograd
// convolution for s or its layout would not fit.
bool transform_into(const float* packed, const ConvShape& s, float* slot, int64_t slot_floats) {
    WinogradHeader h{kWinogradMagic, 0, s.ic, s.oc, 0, 0, s.block, slot_floats};
    const auto p = winograd_primitive(s, true, false);
    const size_t bytes = p ? p->pd.weights_desc().get_size() : 0;
    if (p && kHeaderFloats + static_cast<int64_t>(bytes / sizeof(float)) <= slot_floats) {
        const dnnl_memory_desc_t& md = p->pd.weights_desc().data;
        const dnnl_wino_desc_t& wd = md.format_desc.wino_desc;
        const int64_t ic16 = (s.ic + 15) / 16 * 16, oc16 = (s.oc + 15) / 16 * 16;
        if (md.format_kind == dnnl_format_kind_wino && wd.wino_format == dnnl_wino_wei_OBaaIBOIio && wd.r == 3 &&
            wd.alpha == 6 && wd.oc_block == 16 && wd.ic_block == 16 && wd.oc == oc16 && wd.ic == ic16 &&
            wd.oc2_block > 0 && wd.ic2_block > 0 && (oc16 / 16) % wd.oc2_block == 0 &&
            (ic16 / 16) % wd.ic2_block == 0 && static_cast<size_t>(oc16) * ic16 * 36 * sizeof(float) == bytes) {
            winograd_4x3_weights(packed, wd, slot + kHeaderFloats);
        } else {  // another layout (F(2x2, 3x3)): oneDNN's reorder, from the plain weight
            std::vector<float> plain(static_cast<size_t>(s.oc * s.ic * 9));
            const dnnl::memory::dims dims{s.oc, s.ic, 3, 3};
            reorder({dims, dt::f32, weight_tag(s.block)}, packed, {dims, dt::f32, tag::oihw}, plain.data());
            reorder({dims, dt::f32, tag::oihw}, plain.data(), p->pd.weights_desc(), slot + kHeaderFloats);
        }
        h.n = s.n, h.ih = s.ih, h.iw = s.iw;
    }
    std::memset(slot, 0, kHeaderFloats * sizeof(float));
    std::memcpy(slot, &h, sizeof h);
    return h.n > 0;
}

// The own Winograd route, F(2x2, 3x3). oneDNN 2.6 has Winograd convolutions for
// AVX-512 only, and 3x3 convolutions are where AVX2 CPUs (most laptops) spend a UNet
// step's largest share and nearly all of a VAE decode. 16 products of [tiles, ic] by
// [ic, oc] replace a direct convolution's 36 taps per 2x2 outputs (2.25x fewer
// multiplications), for transforms on either side. Its weights U [16][icp][ocp] are
// the same at every image size, so a slot holds them either resident (block 8: 16/9
// of the direct weight, which the slot replaces) or not at all (per call: the header
// alone, the weights transformed into scratch on each call; the VAE's, on any block).
const BlockedKernel* own_kernel(int block) {
    return blocked_kernel_named(block == 16 ? "avx512" : block == 8 ? "avx2" : "");
}

bool own_winograd_shape(const ConvShape& s) {
    return s.kh == 3 && s.kw == 3 && s.stride == 1 && s.pad_top == 1 && s.pad_left == 1 && s.pad_bottom == 1 &&
           s.pad_right == 1 && own_kernel(s.block) != nullptr;
}

constexpr int64_t kPerCall = -1;  // a header's n for a per-call slot

// Per-call weights are made only where they pay and stay small: at 256 2x2 tiles
// (one 32x32 image) a 640-channel layer ran 1.45x the direct convolution, 1.63x with
// its weights resident, and the fewer the tiles the more the transform weighs
// (bench/winograd_own.cpp). Their scratch is at most 32 MiB (a 512-channel VAE
// layer's: 16.8 MB). Other calls run the direct convolution.
constexpr int64_t kPerCallMinTiles = 256;
constexpr int64_t kPerCallMaxWeightBytes = int64_t{32} << 20;

int64_t padded(int64_t c, int block) { return (c + block - 1) / block * block; }

int64_t tiles_of(const ConvShape& s) { return s.n * ((s.ih + 1) / 2) * ((s.iw + 1) / 2); }

void own_winograd_weights(const float* packed, const ConvShape& s, float* u) {
    const BlockedKernel& k = *own_kernel(s.block);
    const int64_t icp = padded(s.ic, s.block), ocp = padded(s.oc, s.block);
#pragma omp parallel for schedule(static)
    for (int64_t icb = 0; icb < icp / s.block; ++icb) k.winograd_weights(packed, icb, icp / s.block, ocp / s.block, u);
}

// Transformed input and products are made a chunk of tiles at a time, so the scratch
// stays bounded at any image size (the VAE's 128-channel layers at 512² would want 0.5 GB
// at once). Large calls give each thread chunks of its own, small enough to stay in its
// cache (the products then run on one thread each): the VAE's 128-channel layers at 512²
// went from 1.1-1.3x to 1.5-1.8x the direct convolution (bench/winograd_own.cpp). Small calls,
// too few chunks to share out, take one shared chunk at a time, the products threaded.
constexpr int64_t kThreadChunkBytes = int64_t{1} << 20;
constexpr int64_t kThreadChunkMinTiles = 48;  // fewer rows make the products inefficient
constexpr int64_t kSharedChunkBytes = int64_t{16} << 20;

void own_winograd(const ConvShape& s, const float* src, const float* u, const float* bias, float* dst,
                  bool accumulate) {
    const BlockedKernel& k = *own_kernel(s.block);
    WinogradTiles g;
    g.h = s.ih, g.w = s.iw, g.across = (s.iw + 1) / 2, g.per_image = (s.ih + 1) / 2 * g.across;
    g.icp = padded(s.ic, s.block), g.ocp = padded(s.oc, s.block), g.icb = g.icp / s.block, g.ocb = g.ocp / s.block;
    const int64_t tiles = tiles_of(s);
    const int64_t tile_bytes = 16 * (g.icp + g.ocp) * static_cast<int64_t>(sizeof(float));
    std::vector<float> padded_bias;
    if (bias) {
        padded_bias.assign(static_cast<size_t>(g.ocp), 0.0f);
        std::memcpy(padded_bias.data(), bias, sizeof(float) * static_cast<size_t>(s.oc));
    }
    const float* b = bias ? padded_bias.data() : nullptr;
    auto products = [&](const float* v, float* m, int64_t count) {
        for (int64_t x = 0; x < 16; ++x)
            dnnl::sgemm('N', 'N', count, g.ocp, g.icp, 1.0f, v + x * g.chunk * g.icp, g.icp, u + x * g.icp * g.ocp,
                        g.ocp, 0.0f, m + x * g.chunk * g.ocp, g.ocp);
    };
    // Kept per thread between calls: a step makes dozens.
    auto scratch = [&g] {
        thread_local std::vector<float> buffer;
        const size_t need = static_cast<size_t>(16 * g.chunk * (g.icp + g.ocp));
        if (buffer.size() < need) buffer.resize(need);
        return buffer.data();
    };
    const int64_t own_chunk = std::min(std::max(kThreadChunkMinTiles, kThreadChunkBytes / tile_bytes),
                                       std::max<int64_t>(1, kSharedChunkBytes / tile_bytes));
    if (tiles >= 4 * own_chunk * omp_get_max_threads()) {
        g.chunk = own_chunk;
        const int64_t chunks = (tiles + g.chunk - 1) / g.chunk;
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t c = 0; c < chunks; ++c) {  // sgemm runs on one thread inside a parallel region
            float* v = scratch();
            float* m = v + 16 * g.chunk * g.icp;
            const int64_t first = c * g.chunk, count = std::min(g.chunk, tiles - first);
            k.winograd_input(src, g, first, first + count, first, v);
            products(v, m, count);
            k.winograd_output(m, g, first, first + count, first, b, accumulate, dst);
        }
        return;
    }
    g.chunk = std::max<int64_t>(1, std::min(tiles, kSharedChunkBytes / tile_bytes));
    float* v = scratch();
    float* m = v + 16 * g.chunk * g.icp;
    constexpr int64_t kTilesPerTask = 8;
    for (int64_t first = 0; first < tiles; first += g.chunk) {
        const int64_t count = std::min(g.chunk, tiles - first);
#pragma omp parallel for schedule(static)
        for (int64_t t = first; t < first + count; t += kTilesPerTask)
            k.winograd_input(src, g, t, std::min(t + kTilesPerTask, first + count), first, v);
        products(v, m, count);
#pragma omp parallel for schedule(static)
        for (int64_t t = first; t < first + count; t += kTilesPerTask)
            k.winograd_output(m, g, t, std::min(t + kTilesPerTask, first + count), first, b, accumulate, dst);
    }
}

// The per-call form: U into scratch of its own, then the route; false (nothing done)
// where the call is too small to pay for the transform.
bool own_winograd_per_call(const ConvShape& s, const float* src, const float* packed, const float* bias, float* dst,
                           bool accumulate) {
    const int64_t floats = 16 * padded(s.ic, s.block) * padded(s.oc, s.block);
    if (tiles_of(s) < kPerCallMinTiles || floats * static_cast<int64_t>(sizeof(float)) > kPerCallMaxWeightBytes)
        return false;
    thread_local std::vector<float> u;
    const size_t need = static_cast<size_t>(floats);
    if (u.size() < need) u.resize(need);
    own_winograd_weights(packed, s, u.data());
    own_winograd(s, src, u.data(), bias, dst, accumulate);
    return true;
}

void write_header(float* slot, const WinogradHeader& h) {
    std::memset(slot, 0, kHeaderFloats * sizeof(float));
    std::memcpy(slot, &h, sizeof h);
}

}  // namespace

bool conv_blocked(const ConvShape& s, const float* src, const float* packed_weights, float* winograd,
                  int64_t winograd_floats, const float* bias, float* dst, bool accumulate) {
    if (winograd && own_winograd_shape(s)) {
        const WinogradHeader h = header_of(winograd);
        if (h.n == kPerCall) {
            if (own_winograd_per_call(s, src, packed_weights, bias, dst, accumulate)) return true;
            winograd = nullptr;  // a small call: the direct convolution
        } else if (s.block == 8 && h.n > 0) {
            own_winograd(s, src, winograd + kHeaderFloats, bias, dst, accumulate);
            return true;
        }
    }
    if (!packed_weights) throw std::invalid_argument("conv_blocked: no direct weight, and no Winograd form for it");
    auto& eng = dnnl_cpu_engine();
    const dnnl::memory::desc sd({s.n, s.ic, s.ih, s.iw}, dt::f32, act_tag(s.block));
    const dnnl::memory::desc dd({s.n, s.oc, s.oh(), s.ow()}, dt::f32, act_tag(s.block));
    std::shared_ptr<const WinogradPrimitive> wino;
    if (winograd && winograd_primitive(s, true, false)) {  // none for s: the slot stays as it was made
        const WinogradHeader h = header_of(winograd);
        const bool ready = h.n == s.n && h.ih == s.ih && h.iw == s.iw;
        if (ready || transform_into(packed_weights, s, winograd, winograd_floats))
            wino = winograd_primitive(s, bias != nullptr, accumulate, /*slot_layout=*/true);
    }
    const auto direct = wino ? nullptr : conv_primitive(s, bias != nullptr, accumulate);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(sd, eng, const_cast<float*>(src))},
                                               {DNNL_ARG_DST, dnnl::memory(dd, eng, dst)}};
    if (wino)
        args.emplace(DNNL_ARG_WEIGHTS, dnnl::memory(wino->pd.weights_desc(), eng, winograd + kHeaderFloats));
    else
        args.emplace(DNNL_ARG_WEIGHTS, dnnl::memory({{s.oc, s.ic, s.kh, s.kw}, dt::f32, weight_tag(s.block)}, eng,
                                                    const_cast<float*>(packed_weights)));
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory({{s.oc}, dt::f32, tag::a}, eng, const_cast<float*>(bias)));
    dnnl::stream strm(eng);
    if (wino)
        wino->primitive.execute(strm, args);
    else
        direct->execute(strm, args);
    strm.wait();
    return wino != nullptr;
}

int64_t winograd_slot_floats(int64_t oc, int64_t ic, int block) {
    if (block == 8) return own_kernel(8) ? kHeaderFloats + padded(oc, 8) * padded(ic, 8) * 16 : 0;
    if (block != 16) return 0;
    return kHeaderFloats + (oc + 15) / 16 * 16 * ((ic + 15) / 16 * 16) * 36;  // F(4x4, 3x3): 36 floats for 9
}

bool winograd_runs(const ConvShape& s) {
    return s.block == 8 ? own_winograd_shape(s) : winograd_primitive(s, true, false) != nullptr;
}

bool make_winograd_slot(const float* packed_weights, const ConvShape& s, float* slot, int64_t slot_floats) {
    if (s.block == 8) {  // the own route's weights: one form for every size (n 1 marks it made)
        if (!own_winograd_shape(s) || slot_floats != winograd_slot_floats(s.oc, s.ic, 8)) return false;
        own_winograd_weights(packed_weights, s, slot + kHeaderFloats);
        write_header(slot, {kWinogradMagic, 1, s.ic, s.oc, 0, 0, s.block, slot_floats});
        return true;
    }
    return slot_floats >= kHeaderFloats && transform_into(packed_weights, s, slot, slot_floats);
}

int64_t per_call_winograd_slot_floats(int block) { return own_kernel(block) ? kHeaderFloats : 0; }

bool make_per_call_winograd_slot(const ConvShape& s, float* slot) {
    if (!own_winograd_shape(s)) return false;
    write_header(slot, {kWinogradMagic, kPerCall, s.ic, s.oc, 0, 0, s.block, kHeaderFloats});
    return true;
}

bool winograd_slot_fits(const float* slot, int64_t slot_floats, const ConvShape& s) {
    if (!slot || slot_floats < kHeaderFloats) return false;
    const WinogradHeader h = header_of(slot);
    if (h.magic != kWinogradMagic || h.ic != s.ic || h.oc != s.oc || h.block != s.block || h.floats != slot_floats)
        return false;
    if (h.n == kPerCall) return slot_floats == per_call_winograd_slot_floats(s.block);
    return slot_floats == winograd_slot_floats(s.oc, s.ic, s.block) && h.n >= 0;
}

void pack_conv_weights(const float* w, int64_t oc, int64_t ic, int64_t kh, int64_t kw, int block, float* packed) {
    const dnnl::memory::dims dims{oc, ic, kh, kw};
    reorder({dims, dt::f32, tag::oihw}, w, {dims, dt::f32, weight_tag(block)}, packed);
}

void to_blocked(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int block, float* y) {
    const dnnl::memory::dims dims{n, c, h, w};
    reorder({dims, dt::f32, tag::nchw}, x, {dims, dt::f32, act_tag(block)}, y);
}

void to_plain(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int block, float* y) {
    const dnnl::memory::dims dims{n, c, h, w};
    reorder({dims, dt::f32, act_tag(block)}, x, {dims, dt::f32, tag::nchw}, y);
}

#else

// blocked_kernel() is null in a build without oneDNN, so nothing calls these.
bool conv_blocked(const ConvShape&, const float*, const float*, float*, int64_t, const float*, float*, bool) {
    throw std::runtime_error("this build has no oneDNN: no blocked convolutions");
}
int64_t winograd_slot_floats(int64_t, int64_t, int) { return 0; }
int64_t per_call_winograd_slot_floats(int) { return 0; }
bool make_per_call_winograd_slot(const ConvShape&, float*) { return false; }
bool winograd_runs(const ConvShape&) { return false; }
bool make_winograd_slot(const float*, const ConvShape&, float*, int64_t) { return false; }
bool winograd_slot_fits(const float*, int64_t, const ConvShape&) { return false; }
void pack_conv_weights(const float*, int64_t, int64_t, int64_t, int64_t, int, float*) {
    throw std::runtime_error("this build has no oneDNN: no blocked convolutions");
}
void to_blocked(const float*, int64_t, int64_t, int64_t, int64_t, int, float*) {
    throw std::runtime_error("this build has no oneDNN: no blocked layout");
}
void to_plain(const float*, int64_t, int64_t, int64_t, int64_t, int, float*) {
    throw std::runtime_error("this build has no oneDNN: no blocked layout");
}

#endif

}  // namespace sd::kernels
