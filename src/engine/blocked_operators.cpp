#include "engine/blocked_operators.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "kernels/blocked_kernel.h"

namespace sd {

namespace {

int64_t blocks_of(int64_t c, int64_t block) { return (c + block - 1) / block; }

// The kernel build whose vector is `block` floats, if this CPU and oneDNN run it.
const kernels::BlockedKernel& kernel_for(int64_t block) {
    const char* name = block == 16 ? "avx512" : block == 8 ? "avx2" : nullptr;
    const kernels::BlockedKernel* k = name ? kernels::blocked_kernel_named(name) : nullptr;
    TORCH_CHECK(k, "sd_blocked: no blocked kernels of block ", block, " on this CPU");
    return *k;
}

void check_float_cpu(const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, "sd_blocked: ", what,
                " must be an fp32 CPU tensor");
}

// x as a dense blocked tensor of `channels` channels: reordered if plain.
at::Tensor as_blocked(const at::Tensor& x, int64_t channels, int64_t block) {
    check_float_cpu(x, "the input");
    if (x.dim() == 4) {
        TORCH_CHECK(x.size(1) == channels, "sd_blocked: the input has ", x.size(1), " channels, the block takes ",
                    channels);
        return plain_to_blocked(x, block);
    }
    TORCH_CHECK(x.dim() == 5 && x.size(4) == block && x.size(1) == blocks_of(channels, block),
                "sd_blocked: the input is not a blocked tensor of ", channels, " channels in blocks of ", block);
    return x.contiguous();
}

at::Tensor empty_blocked(int64_t n, int64_t channels, int64_t h, int64_t w, int64_t block) {
    return at::empty({n, blocks_of(channels, block), h, w, block}, at::TensorOptions().dtype(at::kFloat));
}

// A block's result: plain where asked or where its channels would leave padding
// in a tensor passed on (concatenation along channels needs none).
at::Tensor finish(const at::Tensor& y, int64_t channels, int64_t block, bool plain_out) {
    if (!plain_out && channels % block == 0) return y;
    auto out = at::empty({y.size(0), channels, y.size(2), y.size(3)}, y.options());
    kernels::to_plain(y.data_ptr<float>(), y.size(0), channels, y.size(2), y.size(3), static_cast<int>(block),
                      out.data_ptr<float>());
    return out;
}

// The weight as the convolution reads it: packed already (at load), or packed
// now; with its Winograd slot where the packing added one.
struct ConvWeight {
    at::Tensor keep;
    const float* direct = nullptr;
    float* winograd = nullptr;  // the slot: its weights are transformed again for another size
    int64_t winograd_floats = 0;
};

ConvWeight conv_weight(const at::Tensor& w, const kernels::ConvShape& s) {
    check_float_cpu(w, "a convolution weight");
    ConvWeight out;
    const int64_t direct = kernels::packed_conv_weight_floats(s.oc, s.ic, s.kh, s.kw, s.block);
    if (w.dim() == 1 && s.block == 8 && w.numel() == kernels::winograd_slot_floats(s.oc, s.ic, s.block)) {
        // the own route's resident form alone: it replaced the direct weight (never read again)
        out.keep = w.contiguous();
        out.winograd = out.keep.data_ptr<float>();
        out.winograd_floats = w.numel();
        TORCH_CHECK(kernels::winograd_slot_fits(out.winograd, out.winograd_floats, s),
                    "sd_blocked: a packed convolution weight has the wrong size");
        return out;
    }
    if (w.dim() == 4) {
        TORCH_CHECK(w.size(0) == s.oc && w.size(1) == s.ic && w.size(2) == s.kh && w.size(3) == s.kw,
                    "sd_blocked: a convolution weight has the wrong shape");
        out.keep = pack_conv_weight(w, s.block);
    } else {
        TORCH_CHECK(w.dim() == 1 && w.numel() >= direct, "sd_blocked: a packed convolution weight has the wrong size");
        out.keep = w.contiguous();  // the module's own tensor: a slot transformed again stays so
        if (w.numel() > direct) {
            out.winograd = out.keep.data_ptr<float>() + direct;
            out.winograd_floats = w.numel() - direct;
            TORCH_CHECK(kernels::winograd_slot_fits(out.winograd, out.winograd_floats, s),
                        "sd_blocked: a packed convolution weight has the wrong size");
        }
    }
    out.direct = out.keep.data_ptr<float>();
    return out;
}

const float* bias_ptr(const c10::optional<at::Tensor>& b, int64_t out, at::Tensor& keep) {
    if (!b.has_value() || !b->defined()) return nullptr;
    check_float_cpu(*b, "a bias");
    TORCH_CHECK(b->dim() == 1 && b->size(0) == out, "sd_blocked: a bias has the wrong size");
    keep = b->contiguous();
    return keep.data_ptr<float>();
}

void conv(const at::Tensor& src, int64_t in, const at::Tensor& w, const c10::optional<at::Tensor>& b, at::Tensor& dst,
          int64_t out, int64_t k, int64_t stride, int64_t pad_begin, int64_t pad_end, int64_t block, bool accumulate) {
    kernels::ConvShape s;
    s.n = src.size(0), s.ic = in, s.oc = out, s.ih = src.size(2), s.iw = src.size(3), s.kh = k, s.kw = k;
    s.stride = stride, s.pad_top = s.pad_left = pad_begin, s.pad_bottom = s.pad_right = pad_end;
    s.block = static_cast<int>(block);
    TORCH_CHECK(dst.size(2) == s.oh() && dst.size(3) == s.ow(), "sd_blocked: output size mismatch");
    const ConvWeight wp = conv_weight(w, s);
    at::Tensor bias_keep;
    const float* bias = bias_ptr(b, out, bias_keep);
    kernels::conv_blocked(s, src.data_ptr<float>(), wp.direct, wp.winograd, wp.winograd_floats, bias,
                          dst.data_ptr<float>(), accumulate);
}

// y = SiLU(GroupNorm(x + add)) on blocked x [N, Cb, H, W, B] of `channels`
// channels; add [N, channels] per channel or undefined. y may be x.
void group_norm_silu(const kernels::BlockedKernel& kern, const at::Tensor& x, int64_t channels, const at::Tensor& add,
                     const at::Tensor& gamma, const at::Tensor& beta, int64_t groups, double eps, at::Tensor& y) {
    const int64_t n = x.size(0), cb = x.size(1), hw = x.size(2) * x.size(3), B = kern.block;
    TORCH_CHECK(groups > 0 && channels % groups == 0, "sd_blocked: ", channels, " channels in ", groups, " groups");
    check_float_cpu(gamma, "a norm weight");
    check_float_cpu(beta, "a norm bias");
    TORCH_CHECK(gamma.numel() == channels && beta.numel() == channels, "sd_blocked: norm weights of the wrong size");
    const auto g = gamma.contiguous(), b = beta.contiguous();
    // The per-channel addend, padded to whole blocks.
    std::vector<float> addend;
    if (add.defined()) {
        check_float_cpu(add, "emb_out");
        TORCH_CHECK(add.dim() == 2 && add.size(0) == n && add.size(1) == channels, "sd_blocked: emb_out must be [N, ",
                    channels, "]");
        const auto a = add.contiguous();
        addend.assign(n * cb * B, 0.0f);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < channels; ++c) addend[i * cb * B + c] = a.data_ptr<float>()[i * channels + c];
    }
    const float* add_at = addend.empty() ? nullptr : addend.data();
    const float* px = x.data_ptr<float>();
    float* py = y.data_ptr<float>();

    std::vector<double> sum(n * cb * B), sumsq(n * cb * B);
    at::parallel_for(0, n * cb, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p)
            kern.moments(px + p * hw * B, hw, add_at ? add_at + p * B : nullptr, &sum[p * B], &sumsq[p * B]);
    });
    // Per group: mean and variance; per channel: one scale and one shift (padding: 0 and 0).
    std::vector<float> scale(n * cb * B, 0.0f), shift(n * cb * B, 0.0f);
    const int64_t per_group = channels / groups;
    const double count = static_cast<double>(per_group * hw);
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t gi = 0; gi < groups; ++gi) {
            double s = 0, q = 0;
            for (int64_t c = gi * per_group; c < (gi + 1) * per_group; ++c) {
                s += sum[i * cb * B + c];
                q += sumsq[i * cb * B + c];
            }
            const double mean = s / count;
            const double var = std::max(0.0, q / count - mean * mean);
            const double rstd = 1.0 / std::sqrt(var + eps);
            for (int64_t c = gi * per_group; c < (gi + 1) * per_group; ++c) {
                const double a = g.data_ptr<float>()[c] * rstd;
                scale[i * cb * B + c] = static_cast<float>(a);
                shift[i * cb * B + c] = static_cast<float>(b.data_ptr<float>()[c] - mean * a);
            }
        }
    }
    // Pixels per task: whole planes are too few tasks for the VAE (1 image, 8 planes).
    constexpr int64_t kPixels = 4096;
    const int64_t chunks = (hw + kPixels - 1) / kPixels;
    at::parallel_for(0, n * cb * chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const int64_t p = t / chunks, first = (t % chunks) * kPixels;
            const int64_t pixels = std::min(kPixels, hw - first);
            kern.scale_shift(px + (p * hw + first) * B, pixels, add_at ? add_at + p * B : nullptr, &scale[p * B],
                             &shift[p * B], true, py + (p * hw + first) * B);
        }
    });
}

}  // namespace

int blocked_route_block() {
    const auto* k = kernels::blocked_kernel();
    return k ? k->block : 0;
}

at::Tensor plain_to_blocked(const at::Tensor& x, int64_t block) {
    kernel_for(block);
    check_float_cpu(x, "the input");
    TORCH_CHECK(x.dim() == 4, "sd_blocked: a plain tensor must be [N, C, H, W]");
    const auto xc = x.contiguous();
    auto y = empty_blocked(x.size(0), x.size(1), x.size(2), x.size(3), block);
    kernels::to_blocked(xc.data_ptr<float>(), x.size(0), x.size(1), x.size(2), x.size(3), static_cast<int>(block),
                        y.data_ptr<float>());
    return y;
}

at::Tensor blocked_to_plain(const at::Tensor& x) {
    if (x.dim() == 4) return x;
    TORCH_CHECK(x.dim() == 5, "sd_blocked::to_plain: not a blocked tensor");
    check_float_cpu(x, "the input");
    const int64_t block = x.size(4);
    kernel_for(block);
    return finish(x.contiguous(), x.size(1) * block, block, true);
}

at::Tensor pack_conv_weight(const at::Tensor& w, int64_t block, const WinogradSize& winograd) {
    kernel_for(block);
    check_float_cpu(w, "a convolution weight");
    TORCH_CHECK(w.dim() == 4, "sd_blocked: a convolution weight must be [out, in, kh, kw]");
    const auto wc = w.contiguous();
    const int64_t oc = w.size(0), ic = w.size(1), kh = w.size(2), kw = w.size(3);
    const int64_t direct = kernels::packed_conv_weight_floats(oc, ic, kh, kw, static_cast<int>(block));
    const bool wants_slot = (winograd.rows > 0 || winograd.per_call) && kh == 3 && kw == 3;
    const int64_t slot = !wants_slot         ? 0
                         : winograd.per_call ? kernels::per_call_winograd_slot_floats(static_cast<int>(block))
                                             : kernels::winograd_slot_floats(oc, ic, static_cast<int>(block));
    auto p = at::empty({direct + slot}, w.options());
    kernels::pack_conv_weights(wc.data_ptr<float>(), oc, ic, kh, kw, static_cast<int>(block), p.data_ptr<float>());
    if (slot == 0) return p;
    kernels::ConvShape s;
    s.n = winograd.rows, s.ic = ic, s.oc = oc, s.ih = winograd.height, s.iw = winograd.width, s.kh = s.kw = 3;
    s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
    s.block = static_cast<int>(block);
    float* slot_at = p.data_ptr<float>() + direct;
    const bool made = winograd.per_call ? kernels::make_per_call_winograd_slot(s, slot_at)
                                        : kernels::make_winograd_slot(p.data_ptr<float>(), s, slot_at, slot);
    // No Winograd convolution at the size planned for: the direct weight alone.
    if (!made) return p.narrow(0, 0, direct).clone();
    // The own route's resident form is read at every size, so the direct weight goes.
    if (!winograd.per_call && block == 8) return p.narrow(0, direct, slot).clone();
    return p;
}

bool winograd_available() {
    const int block = blocked_route_block();
    if (block == 0) return false;
    kernels::ConvShape probe;  // a UNet first-level layer at 512x512
    probe.n = 1, probe.ic = probe.oc = 320, probe.ih = probe.iw = 64, probe.kh = probe.kw = 3;
    probe.pad_top = probe.pad_left = probe.pad_bottom = probe.pad_right = 1;
    probe.block = block;
    return kernels::winograd_runs(probe);
}

double winograd_added_floats() { return blocked_route_block() == 8 ? 16.0 - 9.0 : 36.0; }

bool has_winograd_form(const at::Tensor& packed, int64_t out, int64_t in, int64_t k, int64_t block) {
    return packed.dim() == 1 &&
           packed.numel() > kernels::packed_conv_weight_floats(out, in, k, k, static_cast<int>(block));
}

at::Tensor blocked_resblock(const at::Tensor& x, const c10::optional<at::Tensor>& emb_out, const at::Tensor& norm1_w,
                            const at::Tensor& norm1_b, double eps1, const at::Tensor& conv1_w,
                            const c10::optional<at::Tensor>& conv1_b, const at::Tensor& norm2_w,
                            const at::Tensor& norm2_b, double eps2, const at::Tensor& conv2_w,
                            const c10::optional<at::Tensor>& conv2_b, const c10::optional<at::Tensor>& skip_w,
                            const c10::optional<at::Tensor>& skip_b, int64_t groups, int64_t in_channels,
                            int64_t out_channels, int64_t block, bool plain_out) {
    const auto& kern = kernel_for(block);
    const bool has_skip = skip_w.has_value() && skip_w->defined();
    TORCH_CHECK(has_skip || in_channels == out_channels, "sd_blocked::resblock: a channel change needs a skip conv");
    const at::Tensor xb = as_blocked(x, in_channels, block);
    const int64_t n = xb.size(0), h = xb.size(2), w = xb.size(3);

    at::Tensor t = at::empty_like(xb);
    group_norm_silu(kern, xb, in_channels, at::Tensor(), norm1_w, norm1_b, groups, eps1, t);
    at::Tensor hidden = empty_blocked(n, out_channels, h, w, block);
    conv(t, in_channels, conv1_w, conv1_b, hidden, out_channels, 3, 1, 1, 1, block, false);
    t = at::Tensor();  // its memory goes before the next temporaries
    const at::Tensor add = emb_out.has_value() && emb_out->defined() ? *emb_out : at::Tensor();
    group_norm_silu(kern, hidden, out_channels, add, norm2_w, norm2_b, groups, eps2, hidden);

    at::Tensor out = empty_blocked(n, out_channels, h, w, block);
    if (has_skip)
        conv(xb, in_channels, *skip_w, skip_b, out, out_channels, 1, 1, 0, 0, block, false);
    else
        out.copy_(xb);
    // The residual add rides on the second convolution: out = skip + conv2(hidden).
    conv(hidden, out_channels, conv2_w, conv2_b, out, out_channels, 3, 1, 1, 1, block, true);
    return finish(out, out_channels, block, plain_out);
}

at::Tensor blocked_conv3x3(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b, int64_t in,
                           int64_t out, int64_t block, const at::Tensor& sum) {
    kernel_for(block);
    TORCH_CHECK(in % block == 0, "sd_blocked::conv3x3: ", in, " input channels are not whole blocks of ", block);
    const at::Tensor xb = as_blocked(x, in, block);
    at::Tensor dst;
    if (sum.defined()) {
        TORCH_CHECK(sum.dim() == 5 && sum.is_contiguous() && sum.size(0) == xb.size(0) &&
                        sum.size(1) == blocks_of(out, block) && sum.size(2) == xb.size(2) &&
                        sum.size(3) == xb.size(3) && sum.size(4) == block,
                    "sd_blocked::conv3x3: the sum is not a blocked tensor of the result's shape");
        check_float_cpu(sum, "the sum");
        dst = sum;
    } else {
        dst = empty_blocked(xb.size(0), out, xb.size(2), xb.size(3), block);
    }
    conv(xb, in, w, b, dst, out, 3, 1, 1, 1, block, sum.defined());
    return dst;
}

at::Tensor blocked_upsample(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b,
                            int64_t channels, int64_t block, bool plain_out) {
    const auto& kern = kernel_for(block);
    const at::Tensor xb = as_blocked(x, channels, block);
    const int64_t n = xb.size(0), cb = xb.size(1), h = xb.size(2), wd = xb.size(3);
    at::Tensor up = empty_blocked(n, channels, 2 * h, 2 * wd, block);
    const float* px = xb.data_ptr<float>();
    float* pu = up.data_ptr<float>();
    at::parallel_for(0, n * cb * h, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const int64_t p = t / h, row = t % h;
            kern.upsample2x(px + p * h * wd * block, h, wd, pu + p * 4 * h * wd * block, row, row + 1);
        }
    });
    at::Tensor out = empty_blocked(n, channels, 2 * h, 2 * wd, block);
    conv(up, channels, w, b, out, channels, 3, 1, 1, 1, block, false);
    return finish(out, channels, block, plain_out);
}

at::Tensor blocked_downsample(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b,
                              int64_t channels, int64_t pad_begin, int64_t pad_end, int64_t block, bool plain_out) {
    kernel_for(block);
    TORCH_CHECK(pad_begin >= 0 && pad_end >= 0 && pad_begin <= 1 && pad_end <= 1,
                "sd_blocked::downsample: padding must be 0 or 1");
    const at::Tensor xb = as_blocked(x, channels, block);
    const int64_t oh = (xb.size(2) + pad_begin + pad_end - 3) / 2 + 1;
    const int64_t ow = (xb.size(3) + pad_begin + pad_end - 3) / 2 + 1;
    TORCH_CHECK(oh > 0 && ow > 0, "sd_blocked::downsample: the input is too small");
    at::Tensor out = empty_blocked(xb.size(0), channels, oh, ow, block);
    conv(xb, channels, w, b, out, channels, 3, 2, pad_begin, pad_end, block, false);
    return finish(out, channels, block, plain_out);
}

void register_blocked_operators() {
    static std::once_flag once;
    std::call_once(once, [] {
        // Held for the life of the process: the modules keep calling the ops.
        static auto* lib = new torch::Library(torch::Library::DEF, "sd_blocked", c10::nullopt, __FILE__, __LINE__);
        lib->def(
            "resblock(Tensor x, Tensor? emb_out, Tensor norm1_w, Tensor norm1_b, float eps1, Tensor conv1_w, "
            "Tensor? conv1_b, Tensor norm2_w, Tensor norm2_b, float eps2, Tensor conv2_w, Tensor? conv2_b, "
            "Tensor? skip_w, Tensor? skip_b, int groups, int in_channels, int out_channels, int block, "
            "bool plain_out) -> Tensor",
            &blocked_resblock);
        lib->def("upsample(Tensor x, Tensor w, Tensor? b, int channels, int block, bool plain_out) -> Tensor",
                 &blocked_upsample);
        lib->def(
            "downsample(Tensor x, Tensor w, Tensor? b, int channels, int pad_begin, int pad_end, int block, "
            "bool plain_out) -> Tensor",
            &blocked_downsample);
        lib->def("to_plain(Tensor x) -> Tensor", &blocked_to_plain);
        // For benchmarks and tests that switch modules from Python (the exports never call these).
        lib->def("pack_weight(Tensor w, int block) -> Tensor",
                 [](const at::Tensor& w, int64_t block) { return pack_conv_weight(w, block); });
        lib->def("route_block() -> int", [] { return static_cast<int64_t>(blocked_route_block()); });
    });
}

}  // namespace sd
