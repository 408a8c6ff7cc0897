// The bf16 Winograd F(2x2, 3x3) route (src/kernels/winograd_bf16.cpp) against
// LibTorch's bf16 convolution (oneDNN's direct one; its weight reordered on each call,
// and once, as the CLI's prepacked layers hold it) at the 3x3 shapes of SD 1.5's
// UNet (guided batch of 2 at 512²) and VAE decoder (one 512² image; indexes 10-17).
// GFLOP/s counted at the direct convolution's
// FLOPs. Error: relative RMS difference from an fp32 convolution of the same bf16
// values, for both routes.
//
//   cmake --build build --target bench_winograd_bf16
//   build/bench_winograd_bf16 [threads] [shape index]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/linear_kernel.h"
#include "kernels/winograd_bf16.h"
#include "timing.h"

namespace {

struct Shape {
    const char* where;
    int64_t n, ic, oc, h;
};

double rel_rms(const at::Tensor& got, const at::Tensor& want) {
    const auto d = got.to(at::kFloat) - want;
    return std::sqrt(d.pow(2).mean().item<double>() / want.pow(2).mean().item<double>());
}

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    at::set_num_threads(threads);
    if (!sd::kernels::cpu_has_bf16()) {
        std::fprintf(stderr, "bench_winograd_bf16: this CPU has no bf16 instructions\n");
        return 1;
    }
    c10::InferenceMode guard;
    const Shape shapes[] = {
        {"level 0 (64², 320)", 2, 320, 320, 64},     {"up level 0 (64², 640->320)", 2, 640, 320, 64},
        {"upsampler to level 0 (64², 640)", 2, 640, 640, 64}, {"level 1 (32², 640)", 2, 640, 640, 32},
        {"up level 1 (32², 1280->640)", 2, 1280, 640, 32}, {"upsampler to level 1 (32², 1280)", 2, 1280, 1280, 32},
        {"level 2 (16², 1280)", 2, 1280, 1280, 16},  {"level 0, 1 image", 1, 320, 320, 64},
        {"level 3 (8², 1280->728: a split call)", 2, 1280, 728, 8}, {"level 2 (16², 1280->728: a split call)", 2, 1280, 728, 16},
        // the VAE decoder's at 512² (one image)
        {"VAE 64², 512", 1, 512, 512, 64},           {"VAE 128², 512", 1, 512, 512, 128},
        {"VAE upsampler to 256², 512", 1, 512, 512, 256}, {"VAE 256², 512->256", 1, 512, 256, 256},
        {"VAE 256², 256", 1, 256, 256, 256},          {"VAE upsampler to 512², 256", 1, 256, 256, 512},
        {"VAE 512², 256->128", 1, 256, 128, 512},     {"VAE 512², 128", 1, 128, 128, 512},
    };
    std::printf("%d threads; GFLOP/s at the direct FLOPs; relative RMS error from fp32\n\n", threads);
    std::printf("| shape | LibTorch bf16 | prepacked bf16 | Winograd bf16 | Winograd / prepacked | error direct | "
                "error Winograd |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    const int only = argc > 2 ? std::atoi(argv[2]) : -1;  // one shape's index alone (for perf)
    for (const auto& s : shapes) {
        if (only >= 0 && &s != &shapes[only]) continue;
        at::manual_seed(1);
        const auto x = at::randn({s.n, s.ic, s.h, s.h}).to(at::kBFloat16);
        const auto w = (at::randn({s.oc, s.ic, 3, 3}) / std::sqrt(9.0 * s.ic)).to(at::kBFloat16);
        const auto b = at::randn({s.oc}).to(at::kBFloat16);
        const auto want = at::conv2d(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat), 1, 1);
        at::Tensor direct;
        const double t_direct = best_seconds([&] { direct = at::conv2d(x, w, b, 1, 1); }, 5);
        // The weight in oneDNN's layout once, as the CLI's prepacked layers hold it.
        const auto packed = at::mkldnn_reorder_conv2d_weight(w.to_mkldnn(), {1, 1}, {1, 1}, {1, 1}, 1);
        const double t_packed = best_seconds(
            [&] { at::mkldnn_convolution(x.to_mkldnn(), packed, b, {1, 1}, {1, 1}, {1, 1}, 1).to_dense(); }, 5);
        auto y = at::empty({s.n, s.oc, s.h, s.h}, x.options());
        const auto bits = [](const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
        bool ran = sd::kernels::winograd_bf16_runs(s.n, s.ic, s.oc, s.h, s.h);
        const double t_wino = best_seconds(
            [&] { ran = sd::kernels::winograd_bf16_conv3x3(bits(x), s.n, s.ic, s.h, s.h, bits(w), s.oc, bits(b), bits(y)); },
            5);
        const double flops = 2.0 * s.n * s.h * s.h * s.oc * s.ic * 9;
        std::printf("| %s | %.0f | %.0f | %.0f | %.2fx | %.3g | %.3g |%s\n", s.where, flops / t_direct / 1e9,
                    flops / t_packed / 1e9, flops / t_wino / 1e9, t_packed / t_wino, rel_rms(direct, want),
                    rel_rms(y, want),
                    ran ? "" : " (the route would not run it)");
    }
    return 0;
}
