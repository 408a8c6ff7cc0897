// Helpers of the k-sampler and SD 2.x conformance tests: fixture arrays as
// tensors, and a reference case run through the CLI and checked against the
// fixtures' pass criteria (tests/fixtures/README.md).
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace sdtest {

// A .npy file (float32, int64 or uint8) as a tensor.
at::Tensor load_tensor(const std::string& path);
nlohmann::json read_json(const std::string& path);
double max_abs_diff(const at::Tensor& a, const at::Tensor& b);
// The model's alphas_cumprod from an exported model.json.
std::vector<float> model_alphas_cumprod(const std::string& model_dir);

// The CLI arguments of a reference case (args.json of tiny/cases, cases_k or tiny2/cases).
std::vector<std::string> case_cli_args(const nlohmann::json& args, const std::string& model, const std::string& outdir);

// Runs the case through the CLI with extra flags and checks latents (1e-4 x
// max|reference|) and images (1 level on at most 0.1% of values).
void check_cli_case(const std::string& case_dir, const std::string& model_dir, const std::vector<std::string>& extra);

}  // namespace sdtest
