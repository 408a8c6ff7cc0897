#include "diffusers_case.h"

#include <cmath>
#include <cstdlib>

#include "io/image_io.h"
#include "io/npy.h"
#include "io/png_text.h"
#include "reference_case.h"
#include "test_util.h"

namespace sdtest {

std::vector<std::string> diffusers_case_args(const nlohmann::json& a, const std::string& model, const std::string& outdir) {
    std::vector<std::string> v = {cli(), "--model", model, "--outdir", outdir, "--quiet",
                                  "--seed", std::to_string(a.at("seed").get<long long>()),
                                  "--H", std::to_string(a.at("H").get<int>()), "--W", std::to_string(a.at("W").get<int>()),
                                  "--steps", std::to_string(a.at("num_inference_steps").get<int>()), "--sampler", "ddim",
                                  "--scale", std::to_string(a.at("guidance_scale").get<double>()),
                                  "--n_samples", std::to_string(a.at("n").get<int>()),
                                  "--prompt", a.at("prompt").get<std::string>()};
    if (a.contains("negative_prompt") && a["negative_prompt"].is_string())
        v.insert(v.end(), {"--negative-prompt", a["negative_prompt"].get<std::string>()});
    return v;
}

bool CaseRun::matches() const {
    return exit_code == 0 && latents_diff <= latents_limit && image_max_diff <= 1 && image_differing <= image_values / 1000;
}

std::string CaseRun::describe() const {
    return "exit " + std::to_string(exit_code) + ", latents max diff " + std::to_string(latents_diff) + " (limit " +
           std::to_string(latents_limit) + "), image max diff " + std::to_string(image_max_diff) + " levels on " +
           std::to_string(image_differing) + " of " + std::to_string(image_values) + " values" +
           (err.empty() ? "" : "; stderr: " + err);
}

CaseRun run_diffusers_case(const std::string& case_dir, const std::string& model, const std::vector<std::string>& extra) {
    const auto a = read_json(case_dir + "/args.json");
    const std::string out = temp_dir();
    auto args = diffusers_case_args(a, model, out + "/img");
    args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run(args);
    CaseRun c;
    c.exit_code = r.exit_code;
    c.err = r.err;
    if (r.exit_code != 0) return c;

    const auto ref = sd::read_npy(case_dir + "/latents.npy");
    const auto got = sd::read_npy(out + "/latents.npy");
    double ref_max = 0;
    c.latents_diff = got.shape == ref.shape ? 0 : INFINITY;
    for (int64_t i = 0; i < ref.numel() && got.shape == ref.shape; ++i) {
        ref_max = std::max(ref_max, std::fabs(double(ref.as<float>()[i])));
        c.latents_diff = std::max(c.latents_diff, std::fabs(double(ref.as<float>()[i]) - got.as<float>()[i]));
    }
    c.latents_limit = 1e-4 * ref_max;

    const auto paths = lines(r.out);
    const auto image = sd::read_npy(case_dir + "/image.npy");  // [n, H, W, 3] uint8
    const int64_t per = image.numel() / image.shape[0];
    for (size_t i = 0; i < paths.size() && static_cast<int64_t>(i) < image.shape[0]; ++i) {
        const auto img = sd::read_png(paths[i]);
        if (i == 0) {
            const std::string bytes = read_text(paths[i]);
            c.parameters = sd::png_read_text(std::vector<uint8_t>(bytes.begin(), bytes.end()))["parameters"];
        }
        for (int64_t k = 0; k < per && static_cast<int64_t>(img.rgb.size()) == per; ++k) {
            const int d = std::abs(int(img.rgb[k]) - int(image.as<uint8_t>()[i * per + k]));
            c.image_max_diff = std::max(c.image_max_diff, d);
            c.image_differing += d > 0;
        }
        c.image_values += per;
    }
    if (static_cast<int64_t>(paths.size()) != image.shape[0]) c.image_max_diff = 255;
    return c;
}

}  // namespace sdtest
