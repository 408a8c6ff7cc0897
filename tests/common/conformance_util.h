// Tensor helpers of the tests that link LibTorch: fixture arrays as tensors
// (reference_case.h, included here, runs whole cases through the CLI).
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "reference_case.h"

namespace sdtest {

// A .npy file (float32, int64 or uint8) as a tensor.
at::Tensor load_tensor(const std::string& path);
double max_abs_diff(const at::Tensor& a, const at::Tensor& b);
// The reference UNet replayed for a sampler under test: each call checks that
// the sampler asks for the recorded x (within 1e-4 of its largest value) and t
// (exactly for integer timesteps, within 1e-4 for the k-samplers' fractional
// ones) and returns the recorded guided output e_u + scale (e_c - e_u). Of a
// recorded input with more channels than x (a 9-channel inpainting UNet's)
// only x's channels are compared.
struct ReplayedUnet {
    at::Tensor xs, ts, outs;  // unet_x.npy, unet_t.npy, unet_out.npy of a case
    int64_t n = 1;            // images in the batch
    double scale = 7.5;
    std::string label;        // the case, for messages
    int64_t calls = 0;
    bool guided = true;       // false: one row per image (no CFG), returned as recorded
    at::Tensor operator()(const at::Tensor& x, const at::Tensor& t);
};

// The model's alphas_cumprod from an exported model.json.
std::vector<float> model_alphas_cumprod(const std::string& model_dir);

// A .safetensors file of these tensors as F32 (an alpha: a 0-d tensor).
void write_f32_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// Every tensor of an F16 / F32 .safetensors file, as fp32, in the file's order.
std::vector<std::pair<std::string, at::Tensor>> read_f32_safetensors(const std::string& path);

// A kohya LoRA file (lora_down, lora_up, alpha) written again as LyCORIS modules that make
// the same change: "loha" (w1 = up @ down, w2 all ones) or "lokr" (w1 = [[1]], w2 = up @ down).
// Returns out_path.
std::string lora_as_lycoris(const std::string& lora_path, const std::string& kind, const std::string& out_path);

}  // namespace sdtest
