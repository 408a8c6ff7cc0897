#include "engine/lora_merge.h"

#include <fstream>
#include <map>

#include "sd/error.h"

namespace sd {

namespace {

at::ScalarType dtype_of(const std::string& name) {
    return name == "F32" ? at::kFloat : name == "F16" ? at::kHalf : at::kBFloat16;
}

// One tensor of a LoRA file, widened to fp32 (the index checked its range).
at::Tensor read_tensor(std::ifstream& f, const WeightEntry& w, const std::string& path) {
    at::Tensor t = at::empty(w.shape, at::TensorOptions().dtype(dtype_of(w.dtype)));
    f.seekg(static_cast<std::streamoff>(w.begin));
    if (!f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(w.end - w.begin)))
        throw Error("LoRA file " + path + " cannot be read (truncated?)");
    return t.to(at::kFloat);
}

struct Change {
    const LoraModule* module;
    const std::string* path;
    double weight;
};

}  // namespace

at::Tensor lora_delta(const LoraModule& module, const std::string& path, at::IntArrayRef shape) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("cannot read LoRA file " + path);
    const at::Tensor down = read_tensor(f, module.down, path).flatten(1);
    const at::Tensor up = read_tensor(f, module.up, path).flatten(1);
    return up.mm(down).mul_(module.scale()).reshape(shape);
}

void merge_loras(torch::jit::Module& m, const std::string& stage, const std::vector<LoraMerge>& loras) {
    std::map<std::string, std::vector<Change>> changes;  // parameter -> its changes, in order
    for (const auto& l : loras) {
        const double weight = stage == "unet" ? l.unet_weight : l.text_weight;
        for (const auto& mod : l.file.modules)
            if (mod.stage == stage) changes[mod.param].push_back({&mod, &l.file.path, weight});
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
            if (c.weight != 0) w.add_(lora_delta(*c.module, *c.path, w.sizes()), c.weight);
        at::Tensor target = p.value;
        target.set_data(w);  // the mapped original's last reference goes: its pages are released
        ++applied;
    }
    if (applied != changes.size())
        throw Error("the " + stage + " stage lacks a parameter a LoRA changes (" + changes.begin()->first + ")");
}

}  // namespace sd
