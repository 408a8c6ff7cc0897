#include "engine/vae_override.h"

#include "engine/addon_weights.h"
#include "io/printable.h"
#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

namespace {

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

// SD's VAE decoder is ~50 M parameters (200 MB in fp32; SDXL's the same); the
// decoder tensors of a file needing more than this are not a VAE's.
constexpr uint64_t kMaxVaeBytes = uint64_t{1} << 30;

// A name as vae_decoder.weights spells it, or "" for tensors that are not the
// decoder's. A .ckpt's tensors sit under "state_dict." (read_addon_weights
// names them by their dict path); a full checkpoint's VAE under "first_stage_model.".
std::string decoder_name(std::string name) {
    for (const char* head : {"state_dict.", "first_stage_model."})
        if (starts_with(name, head)) name.erase(0, std::string(head).size());
    return starts_with(name, "decoder.") || starts_with(name, "post_quant_conv.") ? name : "";
}

}  // namespace

std::map<std::string, at::Tensor> read_vae_override(const std::string& path, const std::string& model_weights) {
    std::map<std::string, at::Tensor> found;
    const auto is_decoder = [](const std::string& name) { return !decoder_name(name).empty(); };
    for (auto& [name, t] : read_addon_weights(path, "--vae", kMaxVaeBytes, is_decoder))
        found[decoder_name(name)] = t.contiguous();
    if (found.empty())
        throw Error("--vae " + path +
                    " holds no VAE decoder tensors (decoder.* and post_quant_conv.*, bare or under "
                    "first_stage_model.)");
    const auto model = read_weight_index(model_weights);
    for (const auto& e : model) {
        const auto it = found.find(e.name);
        if (it == found.end())
            throw Error("--vae " + path + " lacks the tensor " + e.name + " of this model's VAE decoder");
        if (const std::string p = float_dtype_problem(it->second); !p.empty())
            throw Error("--vae " + path + ": " + e.name + " " + p);
        if (const std::string p = non_finite_problem(it->second); !p.empty())
            throw Error("--vae " + path + ": its tensor " + e.name + " " + p);
        if (it->second.sizes() != at::IntArrayRef(e.shape))
            throw Error("--vae " + path + ": " + e.name + " is " + shape_text(it->second.sizes().vec()) +
                        ", this model's VAE has " + shape_text(e.shape) + " (a VAE for another model family?)");
    }
    if (found.size() != model.size()) {
        for (const auto& [name, t] : found) {
            bool known = false;
            for (const auto& e : model) known = known || e.name == name;
            if (!known)
                throw Error("--vae " + path + ": " + printable(name) + " is not a tensor of this model's VAE decoder");
        }
    }
    return found;
}

}  // namespace sd
