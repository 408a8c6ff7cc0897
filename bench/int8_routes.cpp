// 8-bit weights on the CPU (issue 37): which way to run the UNet's Linear and
// 3x3 convolution products, timed and checked against fp32.
//
//   A    today's --weights q8: the q8_0 weight (int8 + fp16 scale per 32 values
//        of a row) expanded to a fresh fp32 tensor on every call, then the fp32
//        product (Linear: sd::kernels::linear_f32, oneDNN's inner product on
//        plain weights; conv: LibTorch's dense conv2d);
//   B    oneDNN's int8 product (s8 activations x s8 weights, s32 sums; Linear
//        through its inner product, as today's fp32 Linear): the activations
//        quantized on every call, per tensor (Bt) or per row (Br, Linear only),
//        symmetric; the weights requantized once from the q8_0 blocks to one
//        scale per output channel and prepacked. Its time includes the
//        quantization pass (printed alone too) and, for Br and the convolution,
//        the pass or reorders that put the result back in fp32 NCHW;
//   C    fp32 with the fp32 weight prepacked in oneDNN's layout (the fp32 bound);
//   bf16 activations narrowed to bf16 on every call, bf16 weights prepacked,
//        fp32 result (AMX where oneDNN may use it): 2 bytes a weight held;
//   bf16q the same with the q8_0 weight expanded to bf16 on every call (A in
//        bf16: q8's memory).
// Fidelity: each route's result against the fp32 product with the unquantized
// weights computed in double, ‖y − y_ref‖ / ‖y_ref‖ and max |y − y_ref|.
//
//   cmake --build build --target bench_int8_routes
//   build/bench_int8_routes [threads] [rounds] [weight bits: 8, or 7]   prints Markdown tables
// Rounds alternate the routes inside one process (the machine is shared and
// its load swings): each route's time is its best round, by wall clock and by
// process CPU time (run with OMP_WAIT_POLICY=passive).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/q8_weights.h"
#include "kernels/linear_kernel.h"

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using md = dnnl::memory::desc;
using Args = std::unordered_map<int, dnnl::memory>;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The process's CPU time: under load a long run is preempted more often than a short one, which biases wall
// times towards the faster route; CPU time (OMP_WAIT_POLICY=passive, so waiting threads sleep) mostly is not.
double cpu_now() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// ---- Activation quantization. Written so the compiler vectorizes it, built
// twice (AVX-512 and AVX2) and picked by what oneDNN may use, so that a run
// with DNNL_MAX_CPU_ISA=AVX2 stands in for an AVX2 machine throughout.

// |x| compared as unsigned integers: the order of non-negative floats.
#define SD_ABSMAX_BODY                \
    uint32_t m = 0;                   \
    for (int64_t i = 0; i < n; ++i) { \
        uint32_t u;                   \
        std::memcpy(&u, x + i, 4);    \
        u &= 0x7fffffffu;             \
        m = u > m ? u : m;            \
    }                                 \
    return m;

// Round half away from zero, as ggml does; |x * inv| <= 127 by construction.
#define SD_QUANT_BODY                                                                 \
    for (int64_t i = 0; i < n; ++i) {                                                 \
        const float v = x[i] * inv;                                                   \
        q[i] = static_cast<int8_t>(static_cast<int32_t>(v + std::copysign(0.5f, v))); \
    }

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) uint32_t absmax_bits_512(const float* x,
                                                                                                int64_t n) {
    SD_ABSMAX_BODY
}
__attribute__((target("avx2,fma"))) uint32_t absmax_bits_256(const float* x, int64_t n) { SD_ABSMAX_BODY }
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) void quant_512(const float* x, int64_t n,
                                                                                      float inv, int8_t* q) {
    SD_QUANT_BODY
}
__attribute__((target("avx2,fma"))) void quant_256(const float* x, int64_t n, float inv, int8_t* q) { SD_QUANT_BODY }

bool use_avx512() {
    static const bool yes =
        (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & static_cast<unsigned>(dnnl::cpu_isa::avx512_core)) ==
        static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return yes;
}

float absmax_span(const float* x, int64_t n) {
    const uint32_t b = use_avx512() ? absmax_bits_512(x, n) : absmax_bits_256(x, n);
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
void quant_span(const float* x, int64_t n, float inv, int8_t* q) {
    if (use_avx512())
        quant_512(x, n, inv, q);
    else
        quant_256(x, n, inv, q);
}

constexpr int64_t kChunk = 1 << 16;

// Per tensor: one pass for max |x|, one to quantize. Returns the scale.
float quantize_tensor(const float* x, int64_t n, int8_t* q) {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    float m = 0.0f;
#pragma omp parallel for reduction(max : m)
    for (int64_t c = 0; c < chunks; ++c) m = std::max(m, absmax_span(x + c * kChunk, std::min(kChunk, n - c * kChunk)));
    const float scale = m > 0.0f ? m / 127.0f : 1.0f;
    const float inv = 1.0f / scale;
#pragma omp parallel for
    for (int64_t c = 0; c < chunks; ++c)
        quant_span(x + c * kChunk, std::min(kChunk, n - c * kChunk), inv, q + c * kChunk);
    return scale;
}

// Per row: each row's max and quantization while it is in cache.
void quantize_rows(const float* x, int64_t rows, int64_t cols, int8_t* q, float* scales) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float m = absmax_span(x + r * cols, cols);
        const float scale = m > 0.0f ? m / 127.0f : 1.0f;
        scales[r] = scale;
        quant_span(x + r * cols, cols, 1.0f / scale, q + r * cols);
    }
}

// ---- Weights.

// The q8_0 blocks back to fp32, as the exported layers' _expand does.
at::Tensor expand_q8_0(const at::Tensor& q, const at::Tensor& d) {
    return (q.reshape({d.size(0), d.size(1), 32}).to(at::kFloat) * d.to(at::kFloat).unsqueeze(2)).reshape(q.sizes());
}

// The largest weight level: 127, or 63 (7 bits) for CPUs without VNNI, where oneDNN's u8 x s8 pair sums
// in 16 bits can saturate.
int g_weight_levels = 127;

// One symmetric scale per output channel (dim 0): {int8 weight, fp32 scales}.
std::pair<at::Tensor, at::Tensor> quantize_per_channel(const at::Tensor& w) {
    const auto rows = w.reshape({w.size(0), -1});
    const double levels = g_weight_levels;
    auto scale = rows.abs().amax(1).div(levels).clamp_min(1e-30);
    auto q = (rows / scale.unsqueeze(1)).round().clamp(-levels, levels).to(at::kChar).reshape(w.sizes()).contiguous();
    return {q, scale.contiguous()};
}

double rel_err(const at::Tensor& y, const at::Tensor& ref) {
    return (y.to(at::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
}
double max_abs(const at::Tensor& y, const at::Tensor& ref) {
    return (y.to(at::kDouble) - ref).abs().max().item<double>();
}

dnnl::memory wrap(const md& d, dnnl::engine& eng, const at::Tensor& t) { return dnnl::memory(d, eng, t.data_ptr()); }

// Reorders src into a fresh memory of layout want (once, at "load").
dnnl::memory packed(dnnl::engine& eng, dnnl::stream& s, dnnl::memory src, const md& want) {
    dnnl::memory out(want, eng);
    dnnl::reorder(src, out).execute(s, src, out);
    s.wait();
    return out;
}

struct Route {
    std::string name;
    std::function<at::Tensor()> run;  // returns the fp32 result (plain layout)
    double best = 1e30, best_cpu = 1e30;
    double best_quant = 1e30;  // the quantization / narrowing pass alone, where there is one
    double rel = 0, maxabs = 0;
};

double* g_quant_seconds = nullptr;  // where a route's run() records its quantization pass

void time_rounds(std::vector<Route>& routes, int rounds) {
    for (auto& r : routes) r.run();  // warm: primitives' first run, pages
    for (int k = 0; k < rounds; ++k)
        for (auto& r : routes) {
            double q = -1;
            g_quant_seconds = &q;
            const double t0 = now(), c0 = cpu_now();
            r.run();
            const double t = now() - t0;
            r.best_cpu = std::min(r.best_cpu, cpu_now() - c0);
            g_quant_seconds = nullptr;
            r.best = std::min(r.best, t);
            if (q >= 0) r.best_quant = std::min(r.best_quant, q);
        }
}

void record_quant(double seconds) {
    if (g_quant_seconds) *g_quant_seconds = seconds;
}

struct LinearShape {
    const char* where;
    int64_t rows, in, out;
};

struct ConvShape {
    const char* where;
    int64_t batch, channels, size;
};

std::string ms(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f", s * 1e3);
    return b;
}

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
    if (argc > 3) g_weight_levels = std::atoi(argv[3]) == 7 ? 63 : 127;
    at::set_num_threads(threads);
    omp_set_num_threads(threads);
    at::manual_seed(37);
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    const auto isa = dnnl::get_effective_cpu_isa();
    std::printf(
        "oneDNN %d.%d.%d, effective ISA code 0x%x, %d thread(s), best of %d alternating rounds, int8 "
        "weights in [-%d, %d]\n\n",
        dnnl::version()->major, dnnl::version()->minor, dnnl::version()->patch, static_cast<unsigned>(isa), threads,
        rounds, g_weight_levels, g_weight_levels);

    // ------------------------------------------------------------------ Linear
    const std::vector<LinearShape> lin = {
        {"attn q/k/v/out, 64²", 8192, 320, 320},    {"FF proj (GEGLU), 64²", 8192, 320, 2560},
        {"FF out, 64²", 8192, 1280, 320},           {"cross k/v, 77 tokens", 154, 768, 320},
        {"attn q/k/v/out, 32²", 2048, 640, 640},    {"FF proj (GEGLU), 32²", 2048, 640, 5120},
        {"FF out, 32²", 2048, 2560, 640},           {"attn q/k/v/out, 16²", 512, 1280, 1280},
        {"FF proj (GEGLU), 16²", 512, 1280, 10240}, {"FF out, 16²", 512, 5120, 1280},
    };
    std::printf(
        "Linear y = x wᵀ + b, SD 1.5 UNet at 512², guided (2 rows of latents); wall ms [GFLOP/s] "
        "(CPU ms), ratios by wall (by CPU time):\n\n");
    std::printf(
        "| layer | rows x in -> out | A: q8_0 expand + fp32 | C: fp32 prepacked | Bt: int8 per-tensor | "
        "Br: int8 per-row | quant pass t / r | bf16 | bf16, q8_0 per call | A/Bt | C/Bt | C/Br |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    std::vector<std::string> fid, impls;
    for (const auto& s : lin) {
        const int64_t M = s.rows, K = s.in, N = s.out;
        const double gflop = 2.0 * M * K * N / 1e9;
        const auto x = at::randn({M, K});
        const auto w = at::randn({N, K}) / std::sqrt(static_cast<double>(K));
        const auto b = at::randn({N}) * 0.1;
        const auto ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
        // The outlier case: a few activation channels 20x the rest (fidelity only).
        auto x_out = x.clone();
        x_out.index_copy_(1, at::arange(0, K, K / 4), x_out.index_select(1, at::arange(0, K, K / 4)) * 20.0);
        const auto ref_out = at::linear(x_out.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));

        const auto q8 = sd::quantize_q8_0(w);
        const at::Tensor wq = q8.first, wd = q8.second;
        const auto w_q8 = expand_q8_0(wq, wd);
        const auto pc = quantize_per_channel(w_q8);  // requantized from the q8_0 blocks
        const auto pc_f = quantize_per_channel(w);   // from the fp32 weight
        const at::Tensor wpc = pc.first, wsc = pc.second, wpc_f = pc_f.first, wsc_f = pc_f.second;
        const double werr_q8 = rel_err(w_q8, w.to(at::kDouble));
        const double werr_re = rel_err(wpc.to(at::kFloat) * wsc.unsqueeze(1), w.to(at::kDouble));
        const double werr_pc = rel_err(wpc_f.to(at::kFloat) * wsc_f.unsqueeze(1), w.to(at::kDouble));

        // A: today's.
        auto yA = at::empty({M, N});
        auto runA = [&](const at::Tensor& xin) {
            const auto wf = expand_q8_0(wq, wd);
            sd::kernels::linear_f32(xin.data_ptr<float>(), M, K, wf.data_ptr<float>(), N, b.data_ptr<float>(),
                                    yA.data_ptr<float>());
            return yA;
        };

        // C: fp32 inner product, weight in oneDNN's layout.
        const md src_f({M, K}, dt::f32, tag::ab), dst_f({M, N}, dt::f32, tag::ab), bias_f({N}, dt::f32, tag::a);
        const dnnl::inner_product_forward::primitive_desc ipC(
            {dnnl::prop_kind::forward_inference, src_f, md({N, K}, dt::f32, tag::any), bias_f, dst_f}, eng);
        const auto wC = packed(eng, strm, wrap(md({N, K}, dt::f32, tag::ab), eng, w), ipC.weights_desc());
        const dnnl::inner_product_forward primC(ipC);
        auto yC = at::empty({M, N});
        auto runC = [&] {
            primC.execute(strm, {{DNNL_ARG_SRC, wrap(src_f, eng, x)},
                                 {DNNL_ARG_WEIGHTS, wC},
                                 {DNNL_ARG_BIAS, wrap(bias_f, eng, b)},
                                 {DNNL_ARG_DST, wrap(dst_f, eng, yC)}});
            strm.wait();
            return yC;
        };

        // B: int8 inner product, s8 x s8 -> f32, runtime scales per output column (oneDNN 2.6's matmul
        // takes runtime scales only on its slower gemm:jit path; its inner product keeps AMX / VNNI with them).
        const md src_q({M, K}, dt::s8, tag::ab), wei_any({N, K}, dt::s8, tag::any);
        const md scales_md({N}, dt::f32, tag::a);
        dnnl::primitive_attr attr;
        attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
        // v2.x int8: dst = scale * (sum + bias), so the bias passed is b / scale.
        const dnnl::inner_product_forward::primitive_desc mmBt(
            {dnnl::prop_kind::forward_inference, src_q, wei_any, bias_f, dst_f}, attr, eng);
        const dnnl::inner_product_forward::primitive_desc mmBr(
            {dnnl::prop_kind::forward_inference, src_q, wei_any, dst_f}, attr, eng);
        const md w_plain({N, K}, dt::s8, tag::ab);
        const auto wB = packed(eng, strm, wrap(w_plain, eng, wpc), mmBt.weights_desc());
        const auto wBf = packed(eng, strm, wrap(w_plain, eng, wpc_f), mmBt.weights_desc());
        const auto wBr = packed(eng, strm, wrap(w_plain, eng, wpc), mmBr.weights_desc());
        const auto wBrf = packed(eng, strm, wrap(w_plain, eng, wpc_f), mmBr.weights_desc());
        const dnnl::inner_product_forward primBt(mmBt), primBr(mmBr);
        auto qx = at::empty({M, K}, at::kChar);
        auto sx_rows = at::empty({M});
        auto scales = at::empty({N}), bias_s = at::empty({N});
        auto yBt = at::empty({M, N}), yBr = at::empty({M, N});
        auto runBt = [&](const at::Tensor& xin, const dnnl::memory& wmem, const at::Tensor& wscale) {
            const double t0 = now();
            const float sx = quantize_tensor(xin.data_ptr<float>(), M * K, qx.data_ptr<int8_t>());
            record_quant(now() - t0);
            const float* ws = wscale.data_ptr<float>();
            const float* bp = b.data_ptr<float>();
            float* sp = scales.data_ptr<float>();
            float* bs = bias_s.data_ptr<float>();
            for (int64_t n = 0; n < N; ++n) {
                sp[n] = sx * ws[n];
                bs[n] = bp[n] / sp[n];
            }
            primBt.execute(strm, {{DNNL_ARG_SRC, wrap(src_q, eng, qx)},
                                  {DNNL_ARG_WEIGHTS, wmem},
                                  {DNNL_ARG_BIAS, wrap(bias_f, eng, bias_s)},
                                  {DNNL_ARG_ATTR_OUTPUT_SCALES, wrap(scales_md, eng, scales)},
                                  {DNNL_ARG_DST, wrap(dst_f, eng, yBt)}});
            strm.wait();
            return yBt;
        };
        auto runBr = [&](const at::Tensor& xin, const dnnl::memory& wmem, const at::Tensor& wscale) {
            const double t0 = now();
            quantize_rows(xin.data_ptr<float>(), M, K, qx.data_ptr<int8_t>(), sx_rows.data_ptr<float>());
            record_quant(now() - t0);
            primBr.execute(strm, {{DNNL_ARG_SRC, wrap(src_q, eng, qx)},
                                  {DNNL_ARG_WEIGHTS, wmem},
                                  {DNNL_ARG_ATTR_OUTPUT_SCALES, wrap(scales_md, eng, wscale)},
                                  {DNNL_ARG_DST, wrap(dst_f, eng, yBr)}});
            strm.wait();
            // Each row's own activation scale, and the bias.
            float* y = yBr.data_ptr<float>();
            const float* sr = sx_rows.data_ptr<float>();
            const float* bp = b.data_ptr<float>();
#pragma omp parallel for
            for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < N; ++n) y[m * N + n] = y[m * N + n] * sr[m] + bp[n];
            return yBr;
        };

        // bf16: activations narrowed per call (oneDNN reorder), weights prepacked.
        const md src_h({M, K}, dt::bf16, tag::ab), bias_m({1, N}, dt::f32, tag::ab);
        // (Below AVX-512, as with DNNL_MAX_CPU_ISA=AVX2, oneDNN 2.6 has no bf16 at all: the route is left out.)
        bool has_h = true;
        dnnl::matmul::primitive_desc mmH;
        try {
            mmH = dnnl::matmul::primitive_desc({src_h, md({K, N}, dt::bf16, tag::any), bias_m, dst_f}, eng);
        } catch (const dnnl::error&) {
            has_h = false;
        }
        dnnl::memory wH;
        dnnl::matmul primH;
        if (has_h) {
            wH = packed(eng, strm, wrap(md({K, N}, dt::f32, tag::ba), eng, w), mmH.weights_desc());
            primH = dnnl::matmul(mmH);
        }
        dnnl::memory xh(src_h, eng);
        auto yH = at::zeros({M, N});
        auto runH = [&] {
            if (!has_h) return yH;
            const double t0 = now();
            auto xf = wrap(src_f, eng, x);
            dnnl::reorder(xf, xh).execute(strm, xf, xh);
            strm.wait();
            record_quant(now() - t0);
            primH.execute(strm, {{DNNL_ARG_SRC, xh},
                                 {DNNL_ARG_WEIGHTS, wH},
                                 {DNNL_ARG_BIAS, wrap(bias_m, eng, b)},
                                 {DNNL_ARG_DST, wrap(dst_f, eng, yH)}});
            strm.wait();
            return yH;
        };

        // bf16q: the q8_0 weight expanded to a fresh bf16 tensor on every call (today's A, in bf16: 2 bytes a
        // weight are never held), the product on that plain weight.
        dnnl::matmul::primitive_desc mmHq;
        dnnl::matmul primHq;
        if (has_h) {
            mmHq = dnnl::matmul::primitive_desc({src_h, md({K, N}, dt::bf16, tag::ba), bias_m, dst_f}, eng);
            primHq = dnnl::matmul(mmHq);
        }
        auto yHq = at::zeros({M, N});
        auto runHq = [&] {
            if (!has_h) return yHq;
            const auto wb = expand_q8_0(wq, wd).to(at::kBFloat16);
            auto xf = wrap(src_f, eng, x);
            dnnl::reorder(xf, xh).execute(strm, xf, xh);
            primHq.execute(strm, {{DNNL_ARG_SRC, xh},
                                  {DNNL_ARG_WEIGHTS, wrap(md({K, N}, dt::bf16, tag::ba), eng, wb)},
                                  {DNNL_ARG_BIAS, wrap(bias_m, eng, b)},
                                  {DNNL_ARG_DST, wrap(dst_f, eng, yHq)}});
            strm.wait();
            return yHq;
        };

        std::vector<Route> routes = {
            {"A", [&] { return runA(x); }},
            {"C", runC},
            {"Bt", [&] { return runBt(x, wB, wsc); }},
            {"Br", [&] { return runBr(x, wBr, wsc); }},
            {"bf16", runH},
            {"bf16q", runHq},
        };
        time_rounds(routes, gflop > 5 ? std::max(2, rounds - 2) : rounds);
        for (auto& r : routes) {
            const auto y = r.run();
            r.rel = rel_err(y, ref);
            r.maxabs = max_abs(y, ref);
        }
        if (!has_h) routes[4].rel = routes[4].maxabs = routes[5].rel = routes[5].maxabs = NAN;
        auto cell = [&](const Route& r) {
            char c[64];
            std::snprintf(c, sizeof c, "%s [%.0f] (%s)", ms(r.best).c_str(), gflop / r.best, ms(r.best_cpu).c_str());
            return std::string(c);
        };
        std::printf(
            "| %s | %ld x %ld -> %ld | %s | %s | %s | %s | %s / %s | %s | %s | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) "
            "|\n",
            s.where, (long)M, (long)K, (long)N, cell(routes[0]).c_str(), cell(routes[1]).c_str(),
            cell(routes[2]).c_str(), cell(routes[3]).c_str(), ms(routes[2].best_quant).c_str(),
            ms(routes[3].best_quant).c_str(), has_h ? cell(routes[4]).c_str() : "n/a",
            has_h ? cell(routes[5]).c_str() : "n/a", routes[0].best / routes[2].best,
            routes[0].best_cpu / routes[2].best_cpu, routes[1].best / routes[2].best,
            routes[1].best_cpu / routes[2].best_cpu, routes[1].best / routes[3].best,
            routes[1].best_cpu / routes[3].best_cpu);
        std::fflush(stdout);

        // Fidelity extras: B on per-channel weights quantized from fp32, and the outlier activations.
        const double bt_f = rel_err(runBt(x, wBf, wsc_f), ref), br_f = rel_err(runBr(x, wBrf, wsc_f), ref);
        const double a_o = rel_err(runA(x_out), ref_out), bt_o = rel_err(runBt(x_out, wB, wsc), ref_out),
                     br_o = rel_err(runBr(x_out, wBr, wsc), ref_out);
        char line[512];
        std::snprintf(
            line, sizeof line,
            "| %ld x %ld -> %ld | %.2e / %.2e / %.2e | %.2e (%.3f) | %.2e (%.3f) | %.2e (%.3f) | %.2e (%.3f) | "
            "%.2e (%.3f) | %.2e / %.2e | %.2e / %.2e / %.2e | %.2e (%.3f) | %.4f |",
            (long)M, (long)K, (long)N, werr_q8, werr_re, werr_pc, routes[0].rel, routes[0].maxabs, routes[2].rel,
            routes[2].maxabs, routes[3].rel, routes[3].maxabs, routes[4].rel, routes[4].maxabs, routes[1].rel,
            routes[1].maxabs, bt_f, br_f, a_o, bt_o, br_o, routes[5].rel, routes[5].maxabs,
            ref.abs().max().item<double>());
        fid.push_back(line);
        impls.push_back(std::to_string(M) + "x" + std::to_string(K) + "->" + std::to_string(N) + ": int8 " +
                        mmBt.impl_info_str() + ", fp32 " + ipC.impl_info_str() + ", bf16 " +
                        (has_h ? mmH.impl_info_str() : "none"));
    }
    std::printf("\noneDNN implementations:\n");
    for (const auto& l : impls) std::printf("  %s\n", l.c_str());
    std::printf(
        "\nLinear fidelity: rel = ‖y − y_ref‖/‖y_ref‖ (max |y − y_ref|), y_ref in double with the fp32 "
        "weight. Weight error ‖w' − w‖/‖w‖ for q8_0 / q8_0 requantized per channel / per channel from "
        "fp32. Outlier case: every (in/4)-th activation channel x20.\n\n");
    std::printf(
        "| shape | weight err q8_0 / requant / per-ch | A | Bt | Br | bf16 | C | Bt / Br, per-ch from fp32 | "
        "outliers: A / Bt / Br | bf16, q8_0 per call | max abs y_ref |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const auto& l : fid) std::printf("%s\n", l.c_str());
    std::fflush(stdout);

    // ------------------------------------------------------------------ conv3x3
    const std::vector<ConvShape> convs = {
        {"UNet 512², level 1", 2, 320, 64}, {"UNet 512², level 2", 2, 640, 32}, {"UNet 512², level 3", 2, 1280, 16}};
    std::printf(
        "\nconv3x3, padding 1, batch 2, C -> C; wall ms [GFLOP/s] (CPU ms), ratios by wall (by CPU time). A: LibTorch "
        "conv2d on the expanded "
        "q8_0 weight (today's); C: oneDNN fp32, weight prepacked, activations reordered NCHW -> oneDNN's layout -> "
        "NCHW; Bt: per-tensor s8 "
        "activations (max |x| pass, then oneDNN reorder f32 NCHW -> s8 in the primitive's layout, scaled), "
        "s8 weight per output channel prepacked, f32 result reordered back to NCHW (scaled); bf16: f32 NCHW -> bf16 "
        "(primitive's layout), "
        "result back to f32 NCHW; bf16q: the same with the q8_0 weight expanded to bf16 and reordered on every "
        "call.\n\n");
    std::printf(
        "| layer | N x C x H x W | A | C | C: reorders | Bt | Bt: quant + reorders | bf16 | bf16q | A/Bt | C/Bt | "
        "C/bf16 |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    fid.clear();
    for (const auto& s : convs) {
        const int64_t n = s.batch, c = s.channels, h = s.size;
        const double gflop = 2.0 * n * c * c * 9 * h * h / 1e9;
        const auto x = at::randn({n, c, h, h});
        const auto w = at::randn({c, c, 3, 3}) / std::sqrt(9.0 * c);
        const auto b = at::randn({c}) * 0.1;
        const std::vector<int64_t> pad{1, 1}, stride{1, 1};
        const auto ref = at::conv2d(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble), stride, pad);
        const auto q8 = sd::quantize_q8_0(w);
        const at::Tensor wq = q8.first, wd = q8.second;
        const auto w_q8 = expand_q8_0(wq, wd);
        const auto pc = quantize_per_channel(w_q8);
        const at::Tensor wpc = pc.first, wsc = pc.second;
        const double werr_q8 = rel_err(w_q8, w.to(at::kDouble));
        const double werr_re = rel_err(wpc.to(at::kFloat) * wsc.reshape({c, 1, 1, 1}), w.to(at::kDouble));

        auto runA = [&] { return at::conv2d(x, expand_q8_0(wq, wd), b, stride, pad); };

        const dnnl::memory::dims xd{n, c, h, h}, wdims{c, c, 3, 3}, pd1{1, 1};
        const md x_nchw(xd, dt::f32, tag::nchw), bias_f({c}, dt::f32, tag::a);
        // C: activations in the layout oneDNN picks (blocked), carried in and out by reorders, as the CLI's
        // prepacked convolutions do (LibTorch's mkldnn_convolution reorders NCHW to blocked and back).
        const dnnl::convolution_forward::primitive_desc cC({dnnl::prop_kind::forward_inference,
                                                            dnnl::algorithm::convolution_direct,
                                                            md(xd, dt::f32, tag::any),
                                                            md(wdims, dt::f32, tag::any),
                                                            bias_f,
                                                            md(xd, dt::f32, tag::any),
                                                            {1, 1},
                                                            pd1,
                                                            pd1},
                                                           eng);
        const auto wC = packed(eng, strm, wrap(md(wdims, dt::f32, tag::oihw), eng, w), cC.weights_desc());
        const dnnl::convolution_forward primC(cC);
        const dnnl::reorder c_in({eng, x_nchw, eng, cC.src_desc()}), c_out({eng, cC.dst_desc(), eng, x_nchw});
        dnnl::memory csrc(cC.src_desc(), eng), cdst(cC.dst_desc(), eng);
        auto yC = at::empty({n, c, h, h});
        auto runC = [&] {
            const double t0 = now();
            auto xin = wrap(x_nchw, eng, x);
            c_in.execute(strm, xin, csrc);
            strm.wait();
            const double tr = now() - t0;
            primC.execute(strm, {{DNNL_ARG_SRC, csrc},
                                 {DNNL_ARG_WEIGHTS, wC},
                                 {DNNL_ARG_BIAS, wrap(bias_f, eng, b)},
                                 {DNNL_ARG_DST, cdst}});
            strm.wait();
            const double t1 = now();
            auto yout = wrap(x_nchw, eng, yC);
            c_out.execute(strm, cdst, yout);
            strm.wait();
            record_quant(tr + now() - t1);
            return yC;
        };

        // oneDNN 2.6's int8 convolutions take no runtime scales: the weight's per-channel scales are fixed
        // at creation (they are the weight's), and the activation's scale, known only per call, goes into
        // the two reorders that carry the activations in (f32 NCHW -> s8, times 1/sx) and out (f32, the
        // primitive's layout -> NCHW, times sx). The bias passed is then b / (sx * sw).
        dnnl::primitive_attr attr;
        attr.set_output_scales(1 << 1, std::vector<float>(wsc.data_ptr<float>(), wsc.data_ptr<float>() + c));
        const dnnl::convolution_forward::primitive_desc cB({dnnl::prop_kind::forward_inference,
                                                            dnnl::algorithm::convolution_direct,
                                                            md(xd, dt::s8, tag::any),
                                                            md(wdims, dt::s8, tag::any),
                                                            bias_f,
                                                            md(xd, dt::f32, tag::any),
                                                            {1, 1},
                                                            pd1,
                                                            pd1},
                                                           attr, eng);
        const auto wB = packed(eng, strm, wrap(md(wdims, dt::s8, tag::oihw), eng, wpc), cB.weights_desc());
        const dnnl::convolution_forward primB(cB);
        dnnl::primitive_attr rt_scale;
        rt_scale.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
        const dnnl::reorder to_s8({eng, x_nchw, eng, cB.src_desc(), rt_scale});
        const dnnl::reorder to_nchw({eng, cB.dst_desc(), eng, x_nchw, rt_scale});
        const md one({1}, dt::f32, tag::a);
        dnnl::memory qsrc(cB.src_desc(), eng), bdst(cB.dst_desc(), eng);
        auto bias_s = at::empty({c});
        auto yB = at::empty({n, c, h, h});
        auto runB = [&] {
            const double t0 = now();
            const int64_t count = x.numel(), chunks = (count + kChunk - 1) / kChunk;
            const float* xp = x.data_ptr<float>();
            float m = 0.0f;
#pragma omp parallel for reduction(max : m)
            for (int64_t k = 0; k < chunks; ++k)
                m = std::max(m, absmax_span(xp + k * kChunk, std::min(kChunk, count - k * kChunk)));
            float sx = m > 0.0f ? m / 127.0f : 1.0f, inv = 1.0f / sx;
            to_s8.execute(strm, {{DNNL_ARG_FROM, wrap(x_nchw, eng, x)},
                                 {DNNL_ARG_TO, qsrc},
                                 {DNNL_ARG_ATTR_OUTPUT_SCALES, dnnl::memory(one, eng, &inv)}});
            strm.wait();
            const double tq = now() - t0;
            const float* ws = wsc.data_ptr<float>();
            const float* bp = b.data_ptr<float>();
            float* bs = bias_s.data_ptr<float>();
            for (int64_t o = 0; o < c; ++o) bs[o] = bp[o] / (sx * ws[o]);
            primB.execute(strm, {{DNNL_ARG_SRC, qsrc},
                                 {DNNL_ARG_WEIGHTS, wB},
                                 {DNNL_ARG_BIAS, wrap(bias_f, eng, bias_s)},
                                 {DNNL_ARG_DST, bdst}});
            strm.wait();
            const double t1 = now();
            to_nchw.execute(strm, {{DNNL_ARG_FROM, bdst},
                                   {DNNL_ARG_TO, wrap(x_nchw, eng, yB)},
                                   {DNNL_ARG_ATTR_OUTPUT_SCALES, dnnl::memory(one, eng, &sx)}});
            strm.wait();
            record_quant(tq + now() - t1);
            return yB;
        };

        bool has_h = true;
        dnnl::convolution_forward::primitive_desc cH;
        try {
            cH = dnnl::convolution_forward::primitive_desc({dnnl::prop_kind::forward_inference,
                                                            dnnl::algorithm::convolution_direct,
                                                            md(xd, dt::bf16, tag::any),
                                                            md(wdims, dt::bf16, tag::any),
                                                            bias_f,
                                                            md(xd, dt::f32, tag::any),
                                                            {1, 1},
                                                            pd1,
                                                            pd1},
                                                           eng);
        } catch (const dnnl::error&) {
            has_h = false;
        }
        dnnl::memory wH, hsrc, hdst;
        dnnl::convolution_forward primH;
        if (has_h) {
            wH = packed(eng, strm, wrap(md(wdims, dt::f32, tag::oihw), eng, w), cH.weights_desc());
            primH = dnnl::convolution_forward(cH);
            hsrc = dnnl::memory(cH.src_desc(), eng);
            hdst = dnnl::memory(cH.dst_desc(), eng);
        }
        auto yH = at::zeros({n, c, h, h});
        auto runH = [&] {
            if (!has_h) return yH;
            auto xf = wrap(x_nchw, eng, x);
            dnnl::reorder(xf, hsrc).execute(strm, xf, hsrc);
            primH.execute(strm, {{DNNL_ARG_SRC, hsrc},
                                 {DNNL_ARG_WEIGHTS, wH},
                                 {DNNL_ARG_BIAS, wrap(bias_f, eng, b)},
                                 {DNNL_ARG_DST, hdst}});
            auto out = wrap(x_nchw, eng, yH);
            dnnl::reorder(hdst, out).execute(strm, hdst, out);
            strm.wait();
            return yH;
        };

        // bf16q: the q8_0 weight expanded to bf16 and reordered into the primitive's layout on every call.
        dnnl::memory whq;
        if (has_h) whq = dnnl::memory(cH.weights_desc(), eng);
        auto yHq = at::zeros({n, c, h, h});
        auto runHq = [&] {
            if (!has_h) return yHq;
            const auto wb = expand_q8_0(wq, wd).to(at::kBFloat16);
            auto wplain = wrap(md(wdims, dt::bf16, tag::oihw), eng, wb);
            dnnl::reorder(wplain, whq).execute(strm, wplain, whq);
            auto xf = wrap(x_nchw, eng, x);
            dnnl::reorder(xf, hsrc).execute(strm, xf, hsrc);
            primH.execute(strm, {{DNNL_ARG_SRC, hsrc},
                                 {DNNL_ARG_WEIGHTS, whq},
                                 {DNNL_ARG_BIAS, wrap(bias_f, eng, b)},
                                 {DNNL_ARG_DST, hdst}});
            auto out = wrap(x_nchw, eng, yHq);
            dnnl::reorder(hdst, out).execute(strm, hdst, out);
            strm.wait();
            return yHq;
        };

        std::vector<Route> routes = {{"A", runA}, {"C", runC}, {"Bt", runB}, {"bf16", runH}, {"bf16q", runHq}};
        time_rounds(routes, std::max(2, rounds - 2));
        for (auto& r : routes) {
            const auto y = r.run();
            r.rel = rel_err(y, ref);
            r.maxabs = max_abs(y, ref);
        }
        if (!has_h) routes[3].rel = routes[3].maxabs = routes[4].rel = routes[4].maxabs = NAN;
        auto cell = [&](const Route& r) {
            char t[64];
            std::snprintf(t, sizeof t, "%s [%.0f] (%s)", ms(r.best).c_str(), gflop / r.best, ms(r.best_cpu).c_str());
            return std::string(t);
        };
        std::printf(
            "| %s | %ld x %ld x %ld x %ld | %s | %s | %s | %s | %s | %s | %s | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) "
            "|\n",
            s.where, (long)n, (long)c, (long)h, (long)h, cell(routes[0]).c_str(), cell(routes[1]).c_str(),
            ms(routes[1].best_quant).c_str(), cell(routes[2]).c_str(), ms(routes[2].best_quant).c_str(),
            has_h ? cell(routes[3]).c_str() : "n/a", has_h ? cell(routes[4]).c_str() : "n/a",
            routes[0].best / routes[2].best, routes[0].best_cpu / routes[2].best_cpu, routes[1].best / routes[2].best,
            routes[1].best_cpu / routes[2].best_cpu, has_h ? routes[1].best / routes[3].best : NAN,
            has_h ? routes[1].best_cpu / routes[3].best_cpu : NAN);
        std::fflush(stdout);
        char line[400];
        std::snprintf(line, sizeof line,
                      "| %ld x %ld x %ld x %ld | %.2e / %.2e | %.2e (%.3f) | %.2e (%.3f) | %.2e (%.3f) | %.2e (%.3f) | "
                      "%.2e (%.3f) | %.3f |",
                      (long)n, (long)c, (long)h, (long)h, werr_q8, werr_re, routes[0].rel, routes[0].maxabs,
                      routes[2].rel, routes[2].maxabs, routes[3].rel, routes[3].maxabs, routes[1].rel, routes[1].maxabs,
                      routes[4].rel, routes[4].maxabs, ref.abs().max().item<double>());
        fid.push_back(line);
        std::printf("  (oneDNN implementations: int8 %s, bf16 %s, fp32 %s)\n", cB.impl_info_str(),
                    has_h ? cH.impl_info_str() : "none", cC.impl_info_str());
    }
    std::printf(
        "\nconv fidelity: rel (max abs) against double with the fp32 weight; weight err q8_0 / q8_0 "
        "requantized per channel.\n\n");
    std::printf(
        "| shape | weight err | A | Bt | bf16 | C | bf16q | max abs y_ref |\n| --- | --- | --- | --- | --- | --- | --- "
        "| --- |\n");
    for (const auto& l : fid) std::printf("%s\n", l.c_str());
    return 0;
}
