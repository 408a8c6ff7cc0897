#include "engine/operators.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "kernels/attention_kernel.h"
#include "kernels/bf16_rows.h"
#include "kernels/f32_rows.h"
#include "kernels/linear_kernel.h"
#include "kernels/pointwise_bf16.h"
#include "kernels/winograd_bf16.h"
#include "sd/error.h"

namespace sd {

at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                               double scale) {
    // One head and at most kRows queries at a time, scores in fp32: the memory
    // the planner counts for "fused" holds here too (half precision, CUDA).
    constexpr int64_t kRows = 256;
    const int64_t d = q.size(2) / heads, n = q.size(1);
    auto out = at::empty(q.sizes(), q.options());
    for (int64_t h = 0; h < heads; ++h) {
        const auto kh = k.narrow(2, h * d, d).to(at::kFloat).transpose(1, 2);
        const auto vh = v.narrow(2, h * d, d);
        for (int64_t r = 0; r < n; r += kRows) {
            const int64_t rows = std::min(kRows, n - r);
            const auto qh = q.narrow(1, r, rows).narrow(2, h * d, d).to(at::kFloat);
            const auto w = (at::bmm(qh, kh) * scale).softmax(-1).to(v.scalar_type());
            out.narrow(1, r, rows).narrow(2, h * d, d).copy_(at::bmm(w, vh));
        }
    }
    return out;
}

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads, double scale) {
    TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "sd::attention: q, k, v must be [batch, tokens, width]");
    TORCH_CHECK(heads > 0 && q.size(2) % heads == 0 && k.size(2) == q.size(2) && v.size(2) == q.size(2),
                "sd::attention: widths must be equal and divisible by the head count");
    TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == v.size(1),
                "sd::attention: batch and key counts must agree");
    const auto type = q.scalar_type();
    // bf16 only where the CPU has bf16 instructions: the layers around it then
    // run bf16 too (elsewhere --precision bf16 is refused, and tests use the reference).
    const bool kernel = q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() &&
                        (type == at::kFloat || (type == at::kBFloat16 && kernels::cpu_has_bf16())) &&
                        k.scalar_type() == type && v.scalar_type() == type;
    if (!kernel || q.size(1) == 0 || k.size(1) == 0) return reference_attention(q, k, v, heads, scale);
    const bool bf16 = type == at::kBFloat16;
    // Rows may be strided (views of the projections); each row must be dense.
    const auto qc = q.stride(2) == 1 ? q : q.contiguous();
    const auto kc = k.stride(2) == 1 ? k : k.contiguous();
    const auto vc = v.stride(2) == 1 ? v : v.contiguous();
    auto out = at::empty(q.sizes(), q.options());
    kernels::AttentionProblem p;
    p.batch = q.size(0);
    p.heads = heads;
    p.n = q.size(1);
    p.m = k.size(1);
    p.d = q.size(2) / heads;
    if (bf16) {
        // c10::BFloat16 is the raw 16 bits, as the kernel reads them.
        p.q_bf16 = reinterpret_cast<const uint16_t*>(qc.data_ptr<at::BFloat16>());
        p.k_bf16 = reinterpret_cast<const uint16_t*>(kc.data_ptr<at::BFloat16>());
        p.v_bf16 = reinterpret_cast<const uint16_t*>(vc.data_ptr<at::BFloat16>());
        p.out_bf16 = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    } else {
        p.q = qc.data_ptr<float>();
        p.k = kc.data_ptr<float>();
        p.v = vc.data_ptr<float>();
        p.out = out.data_ptr<float>();
    }
    p.q_batch = qc.stride(0), p.q_row = qc.stride(1);
    p.k_batch = kc.stride(0), p.k_row = kc.stride(1);
    p.v_batch = vc.stride(0), p.v_row = vc.stride(1);
    p.o_batch = out.stride(0), p.o_row = out.stride(1);
    p.scale = static_cast<float>(scale);
    auto packed = at::empty({kernels::packed_floats(p)}, q.options().dtype(at::kFloat));
    p.packed = packed.data_ptr<float>();
    const auto& kern = bf16 ? kernels::attention_kernel_bf16() : kernels::attention_kernel();
    at::parallel_for(0, p.batch * p.heads, 1, [&](int64_t b, int64_t e) { kern.pack(p, b, e); });
    at::parallel_for(0, kernels::attention_tasks(p), 1, [&](int64_t b, int64_t e) { kern.attend(p, b, e); });
    return out;
}

at::Tensor fast_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
    const bool has_bias = bias.has_value() && bias->defined();
    const bool kernel = x.device().is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
                        w.device().is_cpu() && w.dim() == 2 && !w.is_mkldnn() && x.dim() >= 1 &&
                        x.size(-1) == w.size(1) && x.numel() > 0 && w.numel() > 0 &&
                        (!has_bias || (bias->scalar_type() == at::kFloat && bias->device().is_cpu() &&
                                       bias->dim() == 1 && bias->size(0) == w.size(0)));
    if (kernel) {
        const auto xc = x.contiguous();
        const auto wc = w.contiguous();
        const auto bc = has_bias ? bias->contiguous() : at::Tensor();
        auto sizes = x.sizes().vec();
        sizes.back() = w.size(0);
        auto y = at::empty(sizes, x.options());
        if (kernels::linear_f32(xc.data_ptr<float>(), x.numel() / x.size(-1), w.size(1), wc.data_ptr<float>(),
                                w.size(0), has_bias ? bc.data_ptr<float>() : nullptr, y.data_ptr<float>()))
            return y;
    }
    // bf16 goes here too: LibTorch's own bf16 product is oneDNN's matmul (AMX where
    // present, fp32 accumulation), 2-3x the inner product on plain bf16 weights (measured).
    return at::linear(x, w, bias);
}

namespace {

// The row kernels (plain fp32 arithmetic, any CPU) take bf16 CPU tensors; anything else computes the same in fp32 with
// LibTorch.
bool bf16_rows(const at::Tensor& x) { return x.device().is_cpu() && x.scalar_type() == at::kBFloat16; }

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); }
uint16_t* bits_out(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// An optional affine parameter as a dense fp32 tensor (undefined where absent).
at::Tensor affine(const c10::optional<at::Tensor>& t) {
    return t.has_value() && t->defined() ? t->to(at::kFloat).contiguous() : at::Tensor();
}
const float* floats(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// Rows per parallel task: about 64k values each.
int64_t grain(int64_t width) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, width)); }

}  // namespace

at::Tensor geglu(const at::Tensor& h, const c10::optional<at::Tensor>& bias) {
    TORCH_CHECK(h.dim() >= 1 && h.size(-1) % 2 == 0, "sd::geglu: the last dimension must be even");
    const int64_t width = h.size(-1) / 2;
    const auto b = affine(bias);
    TORCH_CHECK(!b.defined() || b.numel() == 2 * width, "sd::geglu: the bias must match the last dimension");
    if (h.device().is_cpu() && h.scalar_type() == at::kFloat && h.numel() > 0) {
        // fp32 (the fused route, GEGLU's fused_rows): one pass, erf by a polynomial (f32_rows.h).
        const auto hc = h.contiguous();
        auto sizes = h.sizes().vec();
        sizes.back() = width;
        auto out = at::empty(sizes, h.options());
        const float* in = hc.data_ptr<float>();
        float* o = out.data_ptr<float>();
        const auto& kern = kernels::f32_row_kernels();
        at::parallel_for(0, hc.numel() / (2 * width), grain(2 * width),
                         [&](int64_t s, int64_t e) { kern.geglu(in, floats(b), o, width, s, e); });
        return out;
    }
    if (!bf16_rows(h) || h.numel() == 0) {
        const auto h32 = b.defined() ? h.to(at::kFloat) + b : h.to(at::kFloat);
        const auto parts = h32.chunk(2, -1);
        return (parts[0] * at::gelu(parts[1])).to(h.scalar_type());
    }
    const auto hc = h.contiguous();
    auto sizes = h.sizes().vec();
    sizes.back() = width;
    auto out = at::empty(sizes, h.options());
    const uint16_t* in = bits(hc);
    uint16_t* o = bits_out(out);
    at::parallel_for(0, hc.numel() / (2 * width), grain(2 * width),
                     [&](int64_t s, int64_t e) { kernels::geglu_bf16(in, floats(b), o, width, s, e); });
    return out;
}

at::Tensor layer_norm_last(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                           const c10::optional<at::Tensor>& bias, double eps) {
    TORCH_CHECK(x.dim() >= 1, "sd::layer_norm: input must have a dimension");
    const int64_t width = x.size(-1);
    const auto w = affine(weight), b = affine(bias);
    TORCH_CHECK((!w.defined() || w.numel() == width) && (!b.defined() || b.numel() == width),
                "sd::layer_norm: weight and bias must match the last dimension");
    if (!bf16_rows(x) || x.numel() == 0)
        return at::layer_norm(x.to(at::kFloat), {width}, w, b, eps).to(x.scalar_type());
    const auto xc = x.contiguous();
    auto out = at::empty(x.sizes(), x.options());
    const uint16_t* in = bits(xc);
    uint16_t* o = bits_out(out);
    at::parallel_for(0, xc.numel() / width, grain(width), [&](int64_t s, int64_t e) {
        kernels::layer_norm_bf16(in, o, width, floats(w), floats(b), static_cast<float>(eps), s, e);
    });
    return out;
}

at::Tensor group_norm(const at::Tensor& x, int64_t groups, const c10::optional<at::Tensor>& weight,
                      const c10::optional<at::Tensor>& bias, double eps) {
    TORCH_CHECK(x.dim() >= 2 && groups > 0 && x.size(1) % groups == 0,
                "sd::group_norm: channels must be divisible by the group count");
    const int64_t channels = x.size(1);
    const auto w = affine(weight), b = affine(bias);
    TORCH_CHECK((!w.defined() || w.numel() == channels) && (!b.defined() || b.numel() == channels),
                "sd::group_norm: weight and bias must match the channel count");
    if (!bf16_rows(x) || x.numel() == 0) return at::group_norm(x.to(at::kFloat), groups, w, b, eps).to(x.scalar_type());
    const auto xc = x.contiguous();
    auto out = at::empty(x.sizes(), x.options());
    const int64_t spatial = xc.numel() / (x.size(0) * channels);
    const uint16_t* in = bits(xc);
    uint16_t* o = bits_out(out);
    at::parallel_for(0, x.size(0) * groups, 1, [&](int64_t s, int64_t e) {
        kernels::group_norm_bf16(in, o, channels, spatial, groups, floats(w), floats(b), static_cast<float>(eps), s, e);
    });
    return out;
}

namespace {

std::atomic<bool> bf16_winograd_on{true};

// x [n, ic, h, w], w [oc, ic, k, k] and b ([oc] or undefined), bf16 on the CPU: what the bf16
// convolution kernels take.
bool bf16_conv_operands(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t k) {
    return bf16_rows(x) && x.dim() == 4 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu() && w.dim() == 4 &&
           w.size(1) == x.size(1) && w.size(2) == k && w.size(3) == k &&
           (!b.defined() || (b.scalar_type() == at::kBFloat16 && b.numel() == w.size(0)));
}

// The [n, oc, h, w] output of kernel(x, w, b or null, y) on the dense operands' bits, or an
// undefined tensor where the kernel did not run.
template <typename Kernel>
at::Tensor run_bf16_conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Kernel kernel) {
    const auto xc = x.contiguous(), wc = w.contiguous();
    const auto bc = b.defined() ? b.contiguous() : b;
    auto out = at::empty({x.size(0), w.size(0), x.size(2), x.size(3)}, x.options());
    return kernel(bits(xc), bits(wc), bc.defined() ? bits(bc) : nullptr, bits_out(out)) ? out : at::Tensor();
}

}  // namespace

void set_bf16_winograd(bool on) { bf16_winograd_on = on; }
bool bf16_winograd_enabled() { return bf16_winograd_on; }

at::Tensor conv3x3(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
    const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
    if (bf16_winograd_on && bf16_conv_operands(x, w, b, 3) &&
        kernels::winograd_bf16_runs(x.size(0), x.size(1), w.size(0), x.size(2), x.size(3))) {
        const at::Tensor out =
            run_bf16_conv(x, w, b, [&](const uint16_t* xb, const uint16_t* wb, const uint16_t* bb, uint16_t* y) {
                return kernels::winograd_bf16_conv3x3(xb, x.size(0), x.size(1), x.size(2), x.size(3), wb, w.size(0), bb,
                                                      y);
            });
        if (out.defined()) return out;
    }
    return at::conv2d(x, w, b, 1, 1);
}

at::Tensor conv1x1(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
    const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
    if (bf16_conv_operands(x, w, b, 1) && kernels::pointwise_bf16_available()) {
        const at::Tensor out =
            run_bf16_conv(x, w, b, [&](const uint16_t* xb, const uint16_t* wb, const uint16_t* bb, uint16_t* y) {
                return kernels::pointwise_bf16(xb, x.size(0), x.size(1), x.size(2) * x.size(3), wb, w.size(0), bb, y);
            });
        if (out.defined()) return out;
    }
    return at::conv2d(x, w, b);
}

// TorchScript would make two weight-sized temporaries (the widened int8 and the
// product); one pass writes only the result.
at::Tensor expand_q8(const at::Tensor& w, const at::Tensor& scale) {
    TORCH_CHECK(w.scalar_type() == at::kChar && scale.scalar_type() == at::kHalf && scale.dim() == 2 &&
                    w.numel() == scale.numel() * 32,
                "sd::expand_q8: int8 weights with one fp16 scale per 32 values expected");
    const at::Tensor q = w.contiguous(), d = scale.contiguous();
    if (!q.device().is_cpu())
        return (q.view({d.size(0), d.size(1), 32}).to(at::kFloat) * d.to(at::kFloat).unsqueeze(2)).view(q.sizes());
    at::Tensor out = at::empty(q.sizes(), q.options().dtype(at::kFloat));
    const int8_t* qp = q.data_ptr<int8_t>();
    const at::Half* dp = d.data_ptr<at::Half>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, d.numel(), 2048, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
            const float s = static_cast<float>(dp[b]);
            for (int64_t j = 0; j < 32; ++j) op[b * 32 + j] = static_cast<float>(qp[b * 32 + j]) * s;
        }
    });
    return out;
}

void register_operators() {
    static std::once_flag once;
    std::call_once(once, [] {
        // Held for the life of the process: the modules keep calling the op.
        static auto* lib = new torch::Library(torch::Library::DEF, "sd", c10::nullopt, __FILE__, __LINE__);
        lib->def("attention(Tensor q, Tensor k, Tensor v, int heads, float scale) -> Tensor", &fused_attention);
        lib->def("linear(Tensor x, Tensor w, Tensor? b) -> Tensor", &fast_linear);
        lib->def("geglu(Tensor h, Tensor? bias) -> Tensor", &geglu);
        lib->def("layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor", &layer_norm_last);
        lib->def("group_norm(Tensor x, int groups, Tensor? weight, Tensor? bias, float eps) -> Tensor", &group_norm);
        lib->def("expand_q8(Tensor w, Tensor scale) -> Tensor", &expand_q8);
        lib->def("conv3x3(Tensor x, Tensor w, Tensor? b) -> Tensor", &conv3x3);
        lib->def("conv1x1(Tensor x, Tensor w, Tensor? b) -> Tensor", &conv1x1);
    });
}

}  // namespace sd
