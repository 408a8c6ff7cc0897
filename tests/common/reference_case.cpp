#include "reference_case.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "io/image_io.h"
#include "io/npy.h"
#include "test_util.h"

namespace sdtest {

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

std::vector<std::string> case_cli_args(const nlohmann::json& a, const std::string& model, const std::string& outdir) {
    std::string sampler = a.at("sampler").get<std::string>();
    if (sampler == "euler_ancestral") sampler = "euler_a";
    const int steps = a.contains("steps_requested") ? a["steps_requested"].get<int>() : a.at("steps").get<int>();
    std::vector<std::string> v = {cli(), "--model", model, "--outdir", outdir, "--quiet",
                                  "--seed", std::to_string(a.at("seed").get<long long>()),
                                  "--H", std::to_string(a.at("H").get<int>()), "--W", std::to_string(a.at("W").get<int>()),
                                  "--steps", std::to_string(steps), "--sampler", sampler,
                                  "--scale", std::to_string(a.at("scale").get<double>()),
                                  "--n_samples", std::to_string(a.at("n_samples").get<int>())};
    if (a.contains("schedule")) v.insert(v.end(), {"--schedule", a["schedule"] == "karras" ? "karras" : "default"});
    const auto& prompts = a.at("prompts");
    bool same = true;
    for (const auto& p : prompts) same = same && p == prompts[0];
    if (same) {
        v.insert(v.end(), {"--prompt", prompts[0].get<std::string>()});
    } else {
        std::string file = outdir + "-prompts.jsonl", text;
        for (const auto& p : prompts) text += nlohmann::json{{"prompt", p}}.dump() + "\n";
        write_text(file, text);
        v.insert(v.end(), {"--from-file", file});
    }
    return v;
}

void check_cli_case(const std::string& case_dir, const std::string& model_dir, const std::vector<std::string>& extra) {
    const auto a = read_json(case_dir + "/args.json");
    const std::string out = temp_dir();
    auto args = case_cli_args(a, model_dir, out + "/img");
    args.insert(args.end(), extra.begin(), extra.end());
    check_cli_run(case_dir, args, out);
}

double latents_relative_error(const std::string& case_dir, const std::string& latents_npy) {
    auto ref = sd::read_npy(case_dir + "/latents.npy");
    auto got = sd::read_npy(latents_npy);
    if (got.shape != ref.shape) return INFINITY;
    double ref_max = 0, diff = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
        ref_max = std::max(ref_max, std::fabs(double(ref.as<float>()[i])));
        diff = std::max(diff, std::fabs(double(ref.as<float>()[i]) - got.as<float>()[i]));
    }
    return diff / ref_max;
}

void check_cli_run(const std::string& case_dir, std::vector<std::string> args, const std::string& out) {
    args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
    auto r = run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;

    auto ref = sd::read_npy(case_dir + "/latents.npy");
    auto got = sd::read_npy(out + "/latents.npy");
    ASSERT_EQ(got.shape, ref.shape);
    double ref_max = 0, diff = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
        ref_max = std::max(ref_max, std::fabs(double(ref.as<float>()[i])));
        diff = std::max(diff, std::fabs(double(ref.as<float>()[i]) - got.as<float>()[i]));
    }
    EXPECT_LE(diff, 1e-4 * ref_max) << case_dir << ": latents max abs diff " << diff << " (max |ref| " << ref_max << ")";

    auto paths = lines(r.out);
    auto image = sd::read_npy(case_dir + "/image.npy");  // [n, H, W, 3] uint8
    ASSERT_EQ(static_cast<int64_t>(paths.size()), image.shape[0]) << r.out;
    const int64_t per = image.numel() / image.shape[0];
    for (size_t i = 0; i < paths.size(); ++i) {
        auto img = sd::read_png(paths[i]);
        ASSERT_EQ(img.height, image.shape[1]);
        ASSERT_EQ(img.width, image.shape[2]);
        int max_diff = 0;
        int64_t differing = 0;
        for (int64_t k = 0; k < per; ++k) {
            const int d = std::abs(int(img.rgb[k]) - int(image.as<uint8_t>()[i * per + k]));
            max_diff = std::max(max_diff, d);
            differing += d > 0;
        }
        EXPECT_LE(max_diff, 1) << paths[i];
        EXPECT_LE(differing, per / 1000) << paths[i];
    }
}

}  // namespace sdtest
