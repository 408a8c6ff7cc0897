// A diffusers reference case (tests/fixtures/{clip_skip,embeddings}/cases: args.json
// of diffusers' pipeline call) run through the CLI, and how far its outputs are
// from the stored ones. No LibTorch. The result is returned rather than
// asserted, so that a test can also require a variation to fail.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sdtest {

// The CLI arguments for a DDIM case's args.json (prompt, negative_prompt,
// seed, H, W, num_inference_steps, guidance_scale, n).
std::vector<std::string> diffusers_case_args(const nlohmann::json& args, const std::string& model, const std::string& outdir);

struct CaseRun {
    int exit_code = -1;
    std::string err, parameters;   // parameters: the first PNG's "parameters" text
    double latents_diff = 0, latents_limit = 0;  // limit: 1e-4 x max|reference| (the README's criterion)
    int image_max_diff = 0;
    int64_t image_differing = 0, image_values = 0;
    // Latents within their limit, and images within 1 level on at most 0.1% of values.
    bool matches() const;
    std::string describe() const;
};

CaseRun run_diffusers_case(const std::string& case_dir, const std::string& model, const std::vector<std::string>& extra);

}  // namespace sdtest
