#include "engine/q8_weights.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>

#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

namespace {

constexpr int64_t kBlock = 32;

bool narrowable(const at::Tensor& w) {
    if (!w.defined() || !w.is_floating_point() || w.is_mkldnn() || w.dim() < 2 || !w.device().is_cpu()) return false;
    const int64_t rows = w.size(0);
    return rows > 0 && w.numel() % rows == 0 && (w.numel() / rows) % kBlock == 0;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> quantize_q8_0(const at::Tensor& w) {
    const at::Tensor x = w.to(at::kFloat).contiguous();
    const int64_t rows = x.size(0), blocks = x.numel() / kBlock;
    at::Tensor q = at::empty(x.sizes(), at::TensorOptions().dtype(at::kChar));
    at::Tensor d = at::empty({rows, x.numel() / rows / kBlock}, at::TensorOptions().dtype(at::kHalf));
    const float* src = x.data_ptr<float>();
    int8_t* qp = q.data_ptr<int8_t>();
    at::Half* dp = d.data_ptr<at::Half>();
    std::atomic<bool> non_finite{false};
    at::parallel_for(0, blocks, 1024, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
            const float* v = src + b * kBlock;
            float amax = 0.0f;
            bool finite = true;
            for (int64_t j = 0; j < kBlock; ++j) {
                amax = std::max(amax, std::fabs(v[j]));
                finite = finite && std::isfinite(v[j]);
            }
            if (!finite) non_finite = true;  // NaN or inf would cast to int8 undefined
            float scale = amax / 127.0f;
            // A scale that is not a normal float (max|x| below ~1.5e-36) may have no float
            // reciprocal (1 / 1e-40 is inf, and 0 * inf NaN): the block is stored as zeros with
            // d = 0, as ggml's k-quants store a block of near-zero values.
            if (!finite || scale < std::numeric_limits<float>::min()) scale = 0.0f;
            const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
            dp[b] = at::Half(scale);
            for (int64_t j = 0; j < kBlock; ++j) qp[b * kBlock + j] = static_cast<int8_t>(std::round(v[j] * inv));
        }
    });
    if (non_finite) throw Error("holds NaN or infinite values");
    return {q, d};
}

int expand_q8(torch::jit::Module& m) {
    int expanded = 0;
    for (auto sub : m.modules()) {
        if (!sub.hasattr("weight_scale") || !sub.hasattr("weight") || sub.attr("weight_scale").isNone()) continue;
        at::Tensor w = sub.attr("weight").toTensor();
        const at::Tensor d = sub.attr("weight_scale").toTensor();
        // Shapes checked when the file was read (io/weight_file.cpp): [rows, row / 32] scales.
        const at::Tensor blocks =
            w.to(at::kFloat).reshape({d.size(0), d.size(1), kBlock}) * d.to(at::kFloat).unsqueeze(2);
        w.set_data(blocks.reshape(w.sizes()));  // the int8 data's last use: its file pages go
        sub.setattr("weight_scale", c10::IValue());
        ++expanded;
    }
    return expanded;
}

int narrow_to_q8(torch::jit::Module& m, const std::string& path) {
    int narrowed = 0;
    bool any_layer = false;
    for (const auto& named : m.named_modules()) {
        auto sub = named.value;
        if (!sub.hasattr("weight_scale") || !sub.hasattr("weight")) continue;
        any_layer = true;
        if (!sub.attr("weight_scale").isNone()) continue;  // already 8-bit
        at::Tensor w = sub.attr("weight").toTensor();
        if (!narrowable(w)) continue;
        std::pair<at::Tensor, at::Tensor> qd;
        try {
            qd = quantize_q8_0(w);
        } catch (const Error& e) {
            // The weights sit in the stage's .weights file (a folder from before them: in the .pt).
            const std::string file = std::filesystem::exists(weight_file_for(path)) ? weight_file_for(path) : path;
            throw Error("--weights q8: model file " + file + ": its tensor " + named.name + ".weight " + e.what());
        }
        auto& [q, d] = qd;
        w.set_data(q);  // the old data's last use: its file pages go
        sub.setattr("weight_scale", d);
        ++narrowed;
    }
    if (!any_layer)
        throw Error("--weights q8: model file " + path +
                    " was exported before 8-bit weights existed; re-export it with this version's export_model.py");
    // The rest (biases, norms, the few layers whose rows are not whole blocks) in fp32, copied
    // out of the file: left mapped, each read of one could map a whole large page-cache folio
    // around it, the released 8-bit layers' pages included (measured: +330 MiB of RSS during
    // the first SD 1.5 UNet call), and the file's mapping goes once nothing points into it.
    for (const auto& p : m.parameters()) {
        if (p.is_floating_point()) {
            at::Tensor t = p;
            t.set_data(p.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true));
        }
    }
    return narrowed;
}

}  // namespace sd
