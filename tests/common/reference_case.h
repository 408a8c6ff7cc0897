// A reference case (tests/fixtures/README.md) run through the CLI and judged
// by the fixtures' pass criteria. No LibTorch: it reads the .npy arrays itself.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sdtest {

nlohmann::json read_json(const std::string& path);

// The CLI arguments of a reference case's args.json (tiny/cases, cases_k,
// tiny2/cases): one --prompt when the batch repeats one prompt, else a JSONL
// file of its prompts written next to outdir.
std::vector<std::string> case_cli_args(const nlohmann::json& args, const std::string& model, const std::string& outdir);

// Runs the case through the CLI with extra flags and checks latents (1e-4 x
// max|reference|) and images (1 level on at most 0.1% of values).
void check_cli_case(const std::string& case_dir, const std::string& model_dir, const std::vector<std::string>& extra);

// The same checks for a CLI command line of one's own (args[0] the tool; no
// --save-latents, which this adds, writing into the temporary folder `out`).
void check_cli_run(const std::string& case_dir, std::vector<std::string> args, const std::string& out);

// max |latents - reference| / max |reference| of a .npy of final latents (infinite if the shapes differ).
double latents_relative_error(const std::string& case_dir, const std::string& latents_npy);

}  // namespace sdtest
