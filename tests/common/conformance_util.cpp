#include "conformance_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "engine/guidance.h"
#include "io/npy.h"
#include "io/weight_file.h"
#include "reference_case.h"
#include "test_util.h"

namespace sdtest {

at::Tensor load_tensor(const std::string& path) {
    auto a = sd::read_npy(path);
    auto dtype = a.dtype == "<f4" ? at::kFloat : a.dtype == "<i8" ? at::kLong : at::kByte;
    return at::from_blob(a.data.data(), a.shape, dtype).clone();
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
    EXPECT_EQ(a.sizes(), b.sizes());
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

at::Tensor ReplayedUnet::operator()(const at::Tensor& x, const at::Tensor& t) {
    EXPECT_LT(calls, xs.size(0)) << label;
    // A 9-channel inpainting UNet's recorded input is cat(x, mask, masked image
    // latents): the sampler's x is its first channels.
    const at::Tensor want_x = xs[calls].slice(0, 0, n).slice(1, 0, x.size(1)), want_t = ts[calls].slice(0, 0, n);
    EXPECT_LE(max_abs_diff(x, want_x), 1e-4 * xs[calls].abs().max().item<double>() + 1e-6) << label << " call " << calls;
    if (t.is_floating_point()) EXPECT_LE(max_abs_diff(t, want_t), 1e-4) << label << " call " << calls;
    else EXPECT_TRUE(at::equal(t, want_t)) << label << " call " << calls;
    if (!guided) return outs[calls++].slice(0, 0, n);
    auto parts = outs[calls++].chunk(2);
    return sd::guide(parts[0], parts[1], scale);
}

std::vector<float> model_alphas_cumprod(const std::string& model_dir) {
    return read_json(model_dir + "/model.json").at("alphas_cumprod").get<std::vector<float>>();
}

void write_f32_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    nlohmann::json h = nlohmann::json::object();
    std::string data;
    for (const auto& [name, t] : tensors) {
        const at::Tensor c = t.to(at::kFloat).contiguous();
        const size_t bytes = static_cast<size_t>(c.numel()) * 4;
        h[name] = {{"dtype", "F32"}, {"shape", c.sizes().vec()}, {"data_offsets", {data.size(), data.size() + bytes}}};
        data.append(static_cast<const char*>(c.data_ptr()), bytes);
    }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    std::ofstream(path, std::ios::binary) << len << text << data;
}

std::vector<std::pair<std::string, at::Tensor>> read_f32_safetensors(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& w : sd::read_weight_index(path, sd::WeightUse::AnyDtype)) {
        at::Tensor t = at::empty(w.shape, w.dtype == "F16" ? at::kHalf : at::kFloat);
        EXPECT_TRUE(w.dtype == "F16" || w.dtype == "F32") << w.name;
        f.seekg(static_cast<std::streamoff>(w.begin));
        f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(w.end - w.begin));
        out.emplace_back(w.name, t.to(at::kFloat));
    }
    return out;
}

std::string lora_as_lycoris(const std::string& lora_path, const std::string& kind, const std::string& out_path) {
    std::map<std::string, std::map<std::string, at::Tensor>> modules;  // module -> part -> fp32
    for (const auto& [name, t] : read_f32_safetensors(lora_path)) {
        const size_t dot = name.find('.');
        modules[name.substr(0, dot)][name.substr(dot + 1)] = t;
    }
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (auto& [key, p] : modules) {
        const at::Tensor up = p.at("lora_up.weight").flatten(1), down = p.at("lora_down.weight").flatten(1);
        if (p.count("alpha")) out.emplace_back(key + ".alpha", p.at("alpha"));
        if (kind == "loha")
            out.insert(out.end(), {{key + ".hada_w1_a", up},
                                   {key + ".hada_w1_b", down},
                                   {key + ".hada_w2_a", at::ones({up.size(0), 1})},
                                   {key + ".hada_w2_b", at::ones({1, down.size(1)})}});
        else
            out.insert(out.end(), {{key + ".lokr_w1", at::ones({1, 1})}, {key + ".lokr_w2_a", up}, {key + ".lokr_w2_b", down}});
    }
    write_f32_safetensors(out_path, out);
    return out_path;
}

}  // namespace sdtest
