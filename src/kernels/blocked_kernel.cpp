#include "kernels/blocked_kernel.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if SD_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
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

dnnl::engine& cpu_engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

tag act_tag(int block) { return block == 16 ? tag::nChw16c : tag::nChw8c; }
tag weight_tag(int block) { return block == 16 ? tag::OIhw16i16o : tag::OIhw8i8o; }

// Primitives cost far more to make than a small one takes to run; a run uses
// a few dozen shapes (each layer's, at one or two image sizes).
std::shared_ptr<const dnnl::convolution_forward> conv_primitive(const ConvShape& s, bool with_bias, bool accumulate) {
    static std::mutex mu;
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int, bool, bool>;
    static std::map<Key, std::shared_ptr<const dnnl::convolution_forward>> cache;
    const Key key{s.n,       s.ic,       s.oc,         s.ih,        s.iw,    s.kh,      s.kw,      s.stride,
                  s.pad_top, s.pad_left, s.pad_bottom, s.pad_right, s.block, with_bias, accumulate};
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    if (cache.size() >= 512) cache.clear();  // ever-new sizes: start over
    const dnnl::memory::desc src({s.n, s.ic, s.ih, s.iw}, dt::f32, act_tag(s.block));
    const dnnl::memory::desc dst({s.n, s.oc, s.oh(), s.ow()}, dt::f32, act_tag(s.block));
    const dnnl::memory::desc wei({s.oc, s.ic, s.kh, s.kw}, dt::f32, weight_tag(s.block));
    const dnnl::memory::desc bias({s.oc}, dt::f32, tag::a);
    const dnnl::memory::dims strides{s.stride, s.stride}, pad_l{s.pad_top, s.pad_left},
        pad_r{s.pad_bottom, s.pad_right};
    const auto d =
        with_bias
            ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                              src, wei, bias, dst, strides, pad_l, pad_r)
            : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                              src, wei, dst, strides, pad_l, pad_r);
    dnnl::primitive_attr attr;
    if (accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
    }
    auto made = std::make_shared<const dnnl::convolution_forward>(
        dnnl::convolution_forward::primitive_desc(d, attr, cpu_engine()));
    cache.emplace(key, made);
    return made;
}

void reorder(const dnnl::memory::desc& from, const float* x, const dnnl::memory::desc& to, float* y) {
    auto& eng = cpu_engine();
    dnnl::memory src(from, eng, const_cast<float*>(x)), dst(to, eng, y);
    dnnl::stream s(eng);
    dnnl::reorder(src, dst).execute(s, src, dst);
    s.wait();
}

}  // namespace

void conv_blocked(const ConvShape& s, const float* src, const float* packed_weights, const float* bias, float* dst,
                  bool accumulate) {
    const auto prim = conv_primitive(s, bias != nullptr, accumulate);
    auto& eng = cpu_engine();
    const dnnl::memory::desc sd({s.n, s.ic, s.ih, s.iw}, dt::f32, act_tag(s.block));
    const dnnl::memory::desc dd({s.n, s.oc, s.oh(), s.ow()}, dt::f32, act_tag(s.block));
    const dnnl::memory::desc wd({s.oc, s.ic, s.kh, s.kw}, dt::f32, weight_tag(s.block));
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(sd, eng, const_cast<float*>(src))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(wd, eng, const_cast<float*>(packed_weights))},
        {DNNL_ARG_DST, dnnl::memory(dd, eng, dst)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory({{s.oc}, dt::f32, tag::a}, eng, const_cast<float*>(bias)));
    dnnl::stream strm(eng);
    prim->execute(strm, args);
    strm.wait();
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
void conv_blocked(const ConvShape&, const float*, const float*, const float*, float*, bool) {
    throw std::runtime_error("this build has no oneDNN: no blocked convolutions");
}
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
