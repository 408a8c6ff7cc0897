#include "conformance_util.h"

#include <gtest/gtest.h>

#include <cmath>

#include "io/image_io.h"
#include "io/npy.h"
#include "test_util.h"

namespace sdtest {

at::Tensor load_tensor(const std::string& path) {
    auto a = sd::read_npy(path);
    auto dtype = a.dtype == "<f4" ? at::kFloat : a.dtype == "<i8" ? at::kLong : at::kByte;
    return at::from_blob(a.data.data(), a.shape, dtype).clone();
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
    EXPECT_EQ(a.sizes(), b.sizes());
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::vector<float> model_alphas_cumprod(const std::string& model_dir) {
    return read_json(model_dir + "/model.json").at("alphas_cumprod").get<std::vector<float>>();
}

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
    // Every case's batch repeats one prompt.
    v.insert(v.end(), {"--prompt", a.at("prompts").at(0).get<std::string>()});
    return v;
}

void check_cli_case(const std::string& case_dir, const std::string& model_dir, const std::vector<std::string>& extra) {
    const auto a = read_json(case_dir + "/args.json");
    const std::string out = temp_dir();
    auto args = case_cli_args(a, model_dir, out + "/img");
    args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;

    auto ref = load_tensor(case_dir + "/latents.npy");
    auto got = load_tensor(out + "/latents.npy");
    ASSERT_EQ(got.sizes(), ref.sizes());
    const double ref_max = ref.abs().max().item<double>();
    const double diff = max_abs_diff(got, ref);
    EXPECT_LE(diff, 1e-4 * ref_max) << case_dir << ": latents max abs diff " << diff << " (max |ref| " << ref_max << ")";

    auto paths = lines(r.out);
    auto image = load_tensor(case_dir + "/image.npy");  // [n, H, W, 3] uint8
    ASSERT_EQ(static_cast<int64_t>(paths.size()), image.size(0)) << r.out;
    for (size_t i = 0; i < paths.size(); ++i) {
        auto img = sd::read_png(paths[i]);
        ASSERT_EQ(img.height, image.size(1));
        ASSERT_EQ(img.width, image.size(2));
        auto mine = at::from_blob(img.rgb.data(), {img.height, img.width, 3}, at::kByte).to(at::kInt);
        auto d = (mine - image[static_cast<int64_t>(i)].to(at::kInt)).abs();
        EXPECT_LE(d.max().item<int>(), 1) << paths[i];
        EXPECT_LE(d.gt(0).sum().item<int64_t>(), d.numel() / 1000) << paths[i];
    }
}

}  // namespace sdtest
