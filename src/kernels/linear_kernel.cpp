#include "kernels/linear_kernel.h"

#if SD_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <tuple>
#include <unordered_map>

#include "kernels/dnnl_engine.h"
#endif

namespace sd::kernels {

#if SD_HAVE_DNNL

dnnl::engine& dnnl_cpu_engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

namespace {

// Weights stay in their plain [out, in] layout: oneDNN's "any" (blocked)
// layout was 5-15% faster on some shapes, but would need a packed copy of
// every weight, made at load, and the file's pages could no longer back it.
struct Primitive {
    dnnl::inner_product_forward ip;
    dnnl::memory::desc src, weights, bias, dst;
};

std::shared_ptr<const Primitive> make_primitive(int64_t rows, int64_t in, int64_t out, bool has_bias) {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    auto made = std::make_shared<Primitive>();
    Primitive& p = *made;
    p.src = md({rows, in}, dt::f32, tag::ab);
    p.weights = md({out, in}, dt::f32, tag::ab);
    p.bias = has_bias ? md({out}, dt::f32, tag::a) : md();
    p.dst = md({rows, out}, dt::f32, tag::ab);
    const auto d =
        has_bias
            ? dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_inference, p.src, p.weights, p.bias, p.dst)
            : dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_inference, p.src, p.weights, p.dst);
    p.ip = dnnl::inner_product_forward(dnnl::inner_product_forward::primitive_desc(d, dnnl_cpu_engine()));
    return made;
}

// One per layer width and token count.
std::shared_ptr<const Primitive> primitive_for(int64_t rows, int64_t in, int64_t out, bool has_bias) {
    static PrimitiveCache<std::tuple<int64_t, int64_t, int64_t, bool>, Primitive> cache;
    return cache.get({rows, in, out, has_bias}, [&] { return make_primitive(rows, in, out, has_bias); });
}

}  // namespace

bool linear_f32(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, const float* bias, float* y) {
    if (rows <= 0 || in <= 0 || out <= 0) return false;
    try {
        const auto prim = primitive_for(rows, in, out, bias != nullptr);
        const Primitive& p = *prim;
        auto& eng = dnnl_cpu_engine();
        // oneDNN's memory objects only point at the caller's arrays.
        dnnl::memory src(p.src, eng, const_cast<float*>(x));
        dnnl::memory wei(p.weights, eng, const_cast<float*>(w));
        dnnl::memory dst(p.dst, eng, y);
        std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
        if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias, eng, const_cast<float*>(bias)));
        dnnl::stream s(eng);
        p.ip.execute(s, args);
        s.wait();
        return true;
    } catch (const dnnl::error&) {
        return false;
    }
}

bool linear_kernel_available() { return true; }

namespace {
// oneDNN's ISA values are bit sets: each one holds the bits of those below it.
bool effective_isa_has(dnnl::cpu_isa want) {
    const auto have = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    return (have & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}
}  // namespace

bool cpu_has_bf16() {
    static const bool has = effective_isa_has(dnnl::cpu_isa::avx512_core_bf16);
    return has;
}

bool cpu_has_amx() {
    static const bool has = effective_isa_has(dnnl::cpu_isa::avx512_core_amx);
    return has;
}

bool cpu_bf16_dot_outruns_fp32() {
#if defined(__x86_64__)
    return cpu_has_bf16() && __builtin_cpu_is("amd");
#else
    return false;
#endif
}

#else

bool linear_f32(const float*, int64_t, int64_t, const float*, int64_t, const float*, float*) { return false; }
bool linear_kernel_available() { return false; }
bool cpu_has_bf16() { return false; }
bool cpu_has_amx() { return false; }
bool cpu_bf16_dot_outruns_fp32() { return false; }

#endif

}  // namespace sd::kernels
