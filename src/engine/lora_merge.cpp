#include "engine/lora_merge.h"

#include <map>

#include "engine/addon_weights.h"
#include "engine/tensor_file.h"
#include "io/printable.h"
#include "io/tensor_reader.h"
#include "sd/error.h"

namespace sd {

namespace {

// A module's down and up tensors, widened to fp32, checked finite.
std::pair<at::Tensor, at::Tensor> read_pair(const LoraFile& file, const LoraModule& m) {
    if (!file.file) throw Error("LoRA file " + file.path + " is not open (read it with read_lora)");
    const long down = file.file->find(m.down.name), up = file.file->find(m.up.name);
    if (down < 0 || up < 0) throw Error("LoRA file " + file.path + " lacks the tensors of " + printable(m.key));
    NamedTensors t =
        read_tensors(*file.file, [&](const TensorEntry& e) { return e.name == m.down.name || e.name == m.up.name; });
    std::pair<at::Tensor, at::Tensor> out;
    for (auto& [name, tensor] : t) {
        at::Tensor f = tensor.to(at::kFloat);
        if (const std::string p = non_finite_problem(f); !p.empty())
            throw Error("LoRA file " + file.path + ": its tensor " + printable(name) + " " + p);
        (name == m.down.name ? out.first : out.second) = f;
    }
    return out;
}

struct Change {
    const LoraModule* module;
    const LoraFile* file;
    double weight;
};

}  // namespace

at::Tensor lora_delta(const LoraFile& file, const LoraModule& module, at::IntArrayRef shape) {
    const auto [down, up] = read_pair(file, module);
    return up.flatten(1).mm(down.flatten(1)).mul_(module.scale()).reshape(shape);
}

void merge_loras(torch::jit::Module& m, const std::string& stage, const std::vector<LoraMerge>& loras) {
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
        for (const auto& c : it->second)
            if (c.weight != 0) w.add_(lora_delta(*c.file, *c.module, w.sizes()), c.weight);
        at::Tensor target = p.value;
        target.set_data(w);  // the mapped original's last reference goes: its pages are released
        ++applied;
    }
    if (applied != changes.size())
        throw Error("the " + stage + " stage lacks a parameter a LoRA changes (" + changes.begin()->first + ")");
}

}  // namespace sd
