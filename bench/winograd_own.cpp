// The own Winograd F(2x2, 3x3) route (src/kernels/blocked_kernel.cpp) against
// oneDNN's direct convolution on the same blocked activations, at the 3x3 shapes
// of SD 1.5's UNet (guided batch of 2, 512²) and VAE decoder (512²): with its
// weights resident (block 8: AVX2, where oneDNN 2.6 has no Winograd) and made on
// each call (the VAE's form), and on block 16 oneDNN's own F(4x4, 3x3) beside
// them. GFLOP/s counted at the direct convolution's FLOPs; the largest difference
// from the direct result relative to its largest value.
//
//   cmake --build build --target bench_winograd_own
//   DNNL_MAX_CPU_ISA=AVX2 build/bench_winograd_own [threads] [block: 8 or 16]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "engine/blocked_operators.h"
#include "kernels/blocked_kernel.h"
#include "timing.h"

namespace {

struct Shape {
    const char* where;
    int64_t n, ic, oc, h;
};

}  // namespace

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    const int64_t block = argc > 2 ? std::atoi(argv[2]) : 8;
    at::set_num_threads(threads);
    if (!sd::kernels::blocked_kernel_named(block == 16 ? "avx512" : block == 8 ? "avx2" : "")) {
        std::fprintf(stderr, "bench_winograd_own: this CPU has no blocked route of block %lld\n",
                     static_cast<long long>(block));
        return 1;
    }
    c10::InferenceMode guard;
    const Shape shapes[] = {
        {"UNet level 0 (64², 320)", 2, 320, 320, 64},
        {"UNet up level 0 (64², 640->320)", 2, 640, 320, 64},
        {"UNet level 1 (32², 640)", 2, 640, 640, 32},
        {"UNet level 2 (16², 1280)", 2, 1280, 1280, 16},
        {"UNet level 1, 1 row", 1, 640, 640, 32},
        {"UNet level 2, 1 row", 1, 1280, 1280, 16},
        {"UNet level 3 (8², 1280), 1 row", 1, 1280, 1280, 8},
        {"VAE 64², 512", 1, 512, 512, 64},
        {"VAE 128², 512", 1, 512, 512, 128},
        {"VAE 256², 256", 1, 256, 256, 256},
        {"VAE 512², 128", 1, 128, 128, 512},
    };
    std::printf("block %lld, %d threads; GFLOP/s (x the direct one), largest difference\n\n",
                static_cast<long long>(block), threads);
    std::printf("| shape | direct | own, weights resident | own, weights per call | oneDNN Winograd |\n");
    std::printf("|---|---|---|---|---|\n");
    for (const Shape& c : shapes) {
        const auto w = at::randn({c.oc, c.ic, 3, 3}) / std::sqrt(9.0 * c.ic);
        const auto b = 0.1 * at::randn({c.oc});
        const auto x = sd::plain_to_blocked(at::randn({c.n, c.ic, c.h, c.h}), block);
        sd::kernels::ConvShape s;
        s.n = c.n, s.ic = c.ic, s.oc = c.oc, s.ih = s.iw = c.h, s.kh = s.kw = 3, s.block = static_cast<int>(block);
        s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
        // The direct weight alone; the resident form (block 8: the slot alone; block 16: oneDNN's
        // slot after the direct weight); the direct weight and a per-call slot.
        const auto plain = sd::pack_conv_weight(w, block);
        const int64_t direct = plain.numel();
        const auto resident = sd::pack_conv_weight(w, block, {c.n, c.h, c.h});
        const int64_t resident_direct = block == 8 ? 0 : direct;
        auto per_call = at::empty({direct + sd::kernels::per_call_winograd_slot_floats(static_cast<int>(block))});
        per_call.narrow(0, 0, direct).copy_(plain);
        const bool has_per_call = per_call.numel() > direct &&
                                  sd::kernels::make_per_call_winograd_slot(s, per_call.data_ptr<float>() + direct);
        auto y_direct = at::empty({c.n, (c.oc + block - 1) / block, c.h, c.h, block});
        // `at`: where the weight's slot starts (0: no direct weight before it)
        auto run = [&](const at::Tensor& weights, int64_t at, bool slot, at::Tensor& y) {
            float* wp = weights.data_ptr<float>();
            return sd::kernels::conv_blocked(s, x.data_ptr<float>(), at ? wp : nullptr, slot ? wp + at : nullptr,
                                             slot ? weights.numel() - at : 0, b.data_ptr<float>(), y.data_ptr<float>(),
                                             false);
        };
        const double t_direct = best_seconds([&] { run(plain, direct, false, y_direct); }, 3);
        const double gflop = 2.0 * c.n * c.h * c.h * c.oc * c.ic * 9 / 1e9;
        auto column = [&](const at::Tensor& weights, int64_t at, bool present) -> std::string {
            if (!present) return "-";
            auto y = at::empty_like(y_direct);
            if (!run(weights, at, true, y)) return "- (direct ran)";
            const double t = best_seconds([&] { run(weights, at, true, y); }, 3);
            const double diff = ((y - y_direct).abs().max() / y_direct.abs().max()).item<double>();
            char text[96];
            std::snprintf(text, sizeof text, "%.0f (%.2fx), %.1e", gflop / t, t_direct / t, diff);
            return text;
        };
        const bool has_resident = resident.numel() != direct;
        const std::string own_resident = column(resident, resident_direct, has_resident && block == 8);
        const std::string own_per_call = column(per_call, direct, has_per_call);
        const std::string onednn = column(resident, resident_direct, has_resident && block == 16);
        std::printf("| %s | %.0f | %s | %s | %s |\n", c.where, gflop / t_direct, own_resident.c_str(),
                    own_per_call.c_str(), onednn.c_str());
        std::fflush(stdout);
    }
    return 0;
}
