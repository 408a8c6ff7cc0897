// Which way to run a 3x3 convolution on the CPU (issue 21): LibTorch's dense
// call (it reorders the weight into oneDNN's layout on every call), LibTorch's
// mkldnn tensors with the weight prepacked at load (what the CLI does), the
// same with the activations left in oneDNN's blocked layout between layers,
// and oneDNN called directly (libdnnl-dev, the library LibTorch links) with a
// prepacked weight, on plain and on blocked activations; and oneDNN's Winograd
// convolution on blocked activations (what --winograd runs), counted at the direct
// convolution's FLOPs, with its largest difference from the direct result.
//
//   cmake --build build --target bench_conv_routes
//   build/bench_conv_routes [threads]        prints a Markdown table (GFLOP/s)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "timing.h"

namespace {

struct Shape {
    const char* where;
    int64_t batch, channels, size;
};

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    at::set_num_threads(threads);
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);

    const std::vector<Shape> shapes = {
        {"UNet 256²", 2, 320, 32},   {"UNet 256²", 2, 640, 16},  {"UNet 256²", 2, 1280, 8},
        {"UNet 512²", 2, 320, 64},   {"UNet 512²", 2, 640, 32},  {"UNet 512²", 2, 1280, 16},
        {"VAE 512²", 1, 512, 64},    {"VAE 512²", 1, 512, 128},  {"VAE 512²", 1, 256, 256},
        {"VAE 512²", 1, 128, 512},   {"LCM 512²", 1, 320, 64},   {"LCM 512²", 1, 640, 32},
        {"TAESD 512²", 1, 64, 256}, {"TAESD 512²", 1, 64, 512},
    };
    std::printf("conv3x3, padding 1, fp32, %d thread(s), GFLOP/s (best of 5):\n\n", threads);
    std::printf("| layer | N x C x H x W | LibTorch dense | LibTorch, prepacked weight (the CLI) | same, activations kept "
                "blocked | oneDNN direct, plain activations | oneDNN direct, blocked activations | oneDNN Winograd, blocked "
                "activations | Winograd's max difference / max output |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const auto& s : shapes) {
        const int64_t n = s.batch, c = s.channels, h = s.size;
        const double gflop = 2.0 * n * c * c * 9 * h * h / 1e9;
        const int repeats = gflop > 50 ? 2 : 5;
        const auto x = at::randn({n, c, h, h});
        const auto w = at::randn({c, c, 3, 3}) * 0.02;
        const auto b = at::randn({c});
        const std::vector<int64_t> pad{1, 1}, stride{1, 1}, dil{1, 1};

        const double dense = best_seconds([&] { at::conv2d(x, w, b, stride, pad); }, repeats, 2);
        const auto packed = at::mkldnn_reorder_conv2d_weight(w.to_mkldnn(), pad, stride, dil, 1);
        const double torch_packed = best_seconds(
            [&] { at::mkldnn_convolution(x.to_mkldnn(), packed, b, pad, stride, dil, 1).to_dense(); }, repeats, 2);
        const auto xm = x.to_mkldnn();
        const double torch_blocked =
            best_seconds([&] { at::mkldnn_convolution(xm, packed, b, pad, stride, dil, 1); }, repeats, 2);

        // oneDNN directly: weights "any" (reordered once), activations plain or "any".
        at::Tensor out[2];  // direct and Winograd, blocked activations, read back plain
        auto direct = [&](bool blocked, dnnl::algorithm alg = dnnl::algorithm::convolution_direct) {
            const dnnl::memory::dims src_d{n, c, h, h}, wei_d{c, c, 3, 3}, dst_d{n, c, h, h};
            const auto act = blocked ? tag::any : tag::nchw;
            const dnnl::convolution_forward::desc d(
                dnnl::prop_kind::forward_inference, alg, dnnl::memory::desc(src_d, dt::f32, act), dnnl::memory::desc(wei_d, dt::f32, tag::any),
                dnnl::memory::desc({c}, dt::f32, tag::a), dnnl::memory::desc(dst_d, dt::f32, act), {1, 1}, {1, 1},
                {1, 1});
            const dnnl::convolution_forward::primitive_desc pd(d, eng);
            dnnl::memory wplain({wei_d, dt::f32, tag::oihw}, eng, const_cast<float*>(w.data_ptr<float>()));
            dnnl::memory wp(pd.weights_desc(), eng);
            dnnl::reorder(wplain, wp).execute(strm, wplain, wp);
            dnnl::memory xplain({src_d, dt::f32, tag::nchw}, eng, const_cast<float*>(x.data_ptr<float>()));
            dnnl::memory src = xplain;
            if (pd.src_desc() != xplain.get_desc()) {
                src = dnnl::memory(pd.src_desc(), eng);
                dnnl::reorder(xplain, src).execute(strm, xplain, src);
            }
            dnnl::memory bias({{c}, dt::f32, tag::a}, eng, const_cast<float*>(b.data_ptr<float>()));
            dnnl::memory dst(pd.dst_desc(), eng);
            dnnl::convolution_forward conv(pd);
            strm.wait();
            const double seconds = best_seconds(
                [&] {
                    conv.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wp}, {DNNL_ARG_BIAS, bias},
                                        {DNNL_ARG_DST, dst}});
                    strm.wait();
                },
                repeats, 2);
            if (blocked) {
                auto& o = out[alg == dnnl::algorithm::convolution_winograd ? 1 : 0];
                o = at::empty({n, c, h, h});
                dnnl::memory plain({dst_d, dt::f32, tag::nchw}, eng, o.data_ptr<float>());
                dnnl::reorder(dst, plain).execute(strm, dst, plain);
                strm.wait();
            }
            return seconds;
        };
        const double onednn_plain = direct(false), onednn_blocked = direct(true);
        const double winograd = direct(true, dnnl::algorithm::convolution_winograd);
        const double diff = (out[1] - out[0]).abs().max().item<double>() / out[0].abs().max().item<double>();
        std::printf("| %s | %ld x %ld x %ld x %ld | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1e |\n", s.where,
                    (long)n, (long)c, (long)h, (long)h, gflop / dense, gflop / torch_packed, gflop / torch_blocked,
                    gflop / onednn_plain, gflop / onednn_blocked, gflop / winograd, diff);
        std::fflush(stdout);
    }
}
