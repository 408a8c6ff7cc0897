#include "engine/lora_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "engine/addon_weights.h"
#include "engine/tensor_file.h"
#include "io/printable.h"
#include "io/tensor_reader.h"
#include "sd/error.h"

namespace sd {

namespace {

// A module's tensors by part name, widened to fp32, checked finite.
std::map<std::string, at::Tensor> read_parts(const LoraFile& file, const LoraModule& m) {
    if (!file.file) throw Error("LoRA file " + file.path + " is not open (read it with read_lora)");
    std::map<std::string, std::string> part_of;  // tensor name -> part
    for (const auto& [part, w] : m.parts) {
        if (file.file->find(w.name) < 0)
            throw Error("LoRA file " + file.path + " lacks the tensors of " + printable(m.key));
        part_of[w.name] = part;
    }
    NamedTensors t = read_tensors(*file.file, [&](const TensorEntry& e) { return part_of.count(e.name) > 0; });
    std::map<std::string, at::Tensor> out;
    for (auto& [name, tensor] : t) {
        at::Tensor f = tensor.to(at::kFloat);
        if (const std::string p = non_finite_problem(f); !p.empty())
            throw Error("LoRA file " + file.path + ": its tensor " + printable(name) + " " + p);
        out[part_of.at(name)] = f;
    }
    return out;
}

// The CP product LyCORIS stores as t [i, j, kh, kw], a [i, out] and b [j, in]:
// out[p, r, k, l] = sum over i, j of t[i, j, k, l] * a[i, p] * b[j, r].
at::Tensor cp_product(const at::Tensor& t, const at::Tensor& a, const at::Tensor& b) {
    return at::einsum("ijkl,ip,jr->prkl", {t, a, b});
}

// One factor: a @ b.flatten(1), or the CP product when t is given.
at::Tensor factor(const std::map<std::string, at::Tensor>& p, const std::string& a, const std::string& b,
                  const std::string& t) {
    if (p.count(t)) return cp_product(p.at(t), p.at(a), p.at(b));
    return p.at(a).flatten(1).mm(p.at(b).flatten(1));
}

// The largest magnitude of an fp32 tensor, NaN when it holds one (aminmax: one pass, no copy).
double largest_magnitude(const at::Tensor& t) {
    const auto [lo, hi] = at::aminmax(t);
    return std::max(std::fabs(lo.item<double>()), std::fabs(hi.item<double>()));
}
// fp16 rounds every value from 65520 up to Inf.
constexpr double kHalfOverflow = 65520;

struct Change {
    const LoraModule* module;
    const LoraFile* file;
    double weight;
};

// scale() times the module's product, reshaped to `shape` (lora_keys.h).
at::Tensor delta_of(const std::map<std::string, at::Tensor>& p, const LoraModule& module, at::IntArrayRef shape) {
    at::Tensor d;
    switch (module.kind) {
        case LoraKind::lora:
            // LoCon's CP middle [r_up, r_down, kh, kw] sits between up [out, r_up] and down [r_down, in].
            d = p.count("mid") ? cp_product(p.at("mid"), p.at("up").flatten(1).t(), p.at("down").flatten(1))
                               : p.at("up").flatten(1).mm(p.at("down").flatten(1));
            break;
        case LoraKind::loha: {
            // Contiguous, so that the row chunks below are views of it (a CP product is a permuted one).
            d = factor(p, "hada_w1_a", "hada_w1_b", "hada_t1").reshape(shape).contiguous();
            if (p.count("hada_t2")) {
                d.mul_(factor(p, "hada_w2_a", "hada_w2_b", "hada_t2").reshape(shape));
                break;
            }
            // The second product a few rows at a time, so that only one whole-size factor is held.
            const at::Tensor a = p.at("hada_w2_a").flatten(1), b = p.at("hada_w2_b").flatten(1);
            at::Tensor rows = d.view({a.size(0), -1});
            const int64_t step = std::max<int64_t>(1, kLohaRowChunkBytes / 4 / std::max<int64_t>(1, b.size(1)));
            for (int64_t r = 0; r < a.size(0); r += step) {
                const int64_t n = std::min(step, a.size(0) - r);
                rows.narrow(0, r, n).mul_(a.narrow(0, r, n).mm(b));
            }
            break;
        }
        case LoraKind::lokr: {
            at::Tensor w1 = p.count("lokr_w1") ? p.at("lokr_w1") : p.at("lokr_w1_a").mm(p.at("lokr_w1_b"));
            const at::Tensor w2 = p.count("lokr_w2") ? p.at("lokr_w2") : factor(p, "lokr_w2_a", "lokr_w2_b", "lokr_t2");
            if (w2.dim() == 4) w1 = w1.unsqueeze(2).unsqueeze(3);
            d = at::kron(w1, w2.contiguous());
            break;
        }
    }
    return d.mul_(module.scale()).reshape(shape);
}

// DoRA: `merged` rescaled in place so that its norm along the axis dora_axis names is
// the magnitude (LyCORIS adds fp32's epsilon to the norm, so a zero row stays zero).
void decompose(at::Tensor& merged, const at::Tensor& magnitude) {
    const int axis = dora_axis(magnitude.sizes().vec(), merged.sizes().vec());
    std::vector<int64_t> others;
    for (int64_t d = 0; d < merged.dim(); ++d)
        if (d != axis) others.push_back(d);
    const at::Tensor norm = at::linalg_vector_norm(merged, 2, others, /*keepdim=*/true);
    merged.mul_(magnitude / norm.add_(std::numeric_limits<float>::epsilon()));
}

}  // namespace

at::Tensor lora_delta(const LoraFile& file, const LoraModule& module, at::IntArrayRef shape) {
    return delta_of(read_parts(file, module), module, shape);
}

void apply_lora(at::Tensor& w, const LoraFile& file, const LoraModule& module, double weight) {
    const auto p = read_parts(file, module);
    at::Tensor d = delta_of(p, module, w.sizes());
    if (!module.has("dora_scale")) {
        w.add_(d, weight);
        return;
    }
    // W' = W + m * (decompose(W + D) - W), with the merged weight built in D's memory.
    decompose(d.add_(w), p.at("dora_scale"));
    w.mul_(1 - weight).add_(d, weight);
}

void merge_loras(torch::jit::Module& m, const std::string& stage, const std::vector<LoraMerge>& loras,
                 at::ScalarType held) {
    std::map<std::string, std::vector<Change>> changes;  // parameter -> its changes, in order
    for (const auto& l : loras) {
        const double weight = stage == "unet" ? l.unet_weight : l.text_weight;
        for (const auto& mod : l.file.modules)
            if (mod.stage == stage) changes[mod.param].push_back({&mod, &l.file, weight});
    }
    if (changes.empty()) return;
    at::NoGradGuard no_grad;
    size_t applied = 0;
    for (const auto& p : m.named_parameters(/*recurse=*/true)) {
        const auto it = changes.find(p.name);
        if (it == changes.end()) continue;
        // A copy: the original may be the mapped file's bytes (fp32) or fp16.
        at::Tensor w = p.value.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
        double largest = 0;  // of the merged weight
        for (const auto& c : it->second) {
            if (c.weight == 0) continue;
            apply_lora(w, *c.file, *c.module, c.weight);
            // Huge (finite) values in a file, or a large weight, would only show as NaN after sampling.
            largest = largest_magnitude(w);
            if (!std::isfinite(largest))
                throw Error("LoRA file " + c.file->path + ": merging " + printable(c.module->key) + " at weight " +
                            number_text(c.weight) + " into " + stage + " " + p.name +
                            " gives values beyond fp32's range (its tensors or the weight are far too large)");
        }
        if (held == at::kHalf && largest >= kHalfOverflow)
            throw Error("LoRA file " + it->second.back().file->path + ": the merged " + stage + " " + p.name +
                        " holds values beyond fp16's range (largest " + number_text(largest) +
                        "); hold the weights in fp32 (--weights fp32) or lower the LoRA's weight");
        const at::Tensor merged = held == at::kFloat ? w : w.to(held);
        at::Tensor target = p.value;
        target.set_data(merged);  // the mapped original's pages are released
        ++applied;
    }
    if (applied != changes.size())
        throw Error("the " + stage + " stage lacks a parameter a LoRA changes (" + changes.begin()->first + ")");
}

}  // namespace sd
