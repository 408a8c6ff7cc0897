#include "conformance_util.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/guidance.h"
#include "io/npy.h"
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

}  // namespace sdtest
