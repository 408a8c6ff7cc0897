// sd::linear (src/engine/operators.cpp, oneDNN's inner product) against the
// definition, x wᵀ + b computed in double.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/script.h>

#include <tuple>
#include <vector>

#include "engine/operators.h"
#include "kernels/linear_kernel.h"

namespace {

at::Tensor plain_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
    auto y = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
    if (b) y = y + b->to(at::kDouble);
    return y;
}

// Largest error relative to the size of the terms summed (|x| |w|, per output).
double scaled_error(const at::Tensor& got, const at::Tensor& x, const at::Tensor& w,
                    const c10::optional<at::Tensor>& b) {
    const auto want = plain_linear(x, w, b);
    const auto scale = at::matmul(x.to(at::kDouble).abs(), w.to(at::kDouble).abs().t()) + 1.0;
    return ((got.to(at::kDouble) - want).abs() / scale).max().item<double>();
}

}  // namespace

TEST(FastLinear, ThisBuildHasOneDnn) {
    // scripts/setup.sh installs libdnnl-dev; without it the op still works
    // (at::linear) but Linear layers are 3x slower, which a build should not hide.
    EXPECT_TRUE(sd::kernels::linear_kernel_available());
}

TEST(FastLinear, MatchesTheDefinitionOnManyShapes) {
    at::manual_seed(3);
    // rows, in, out: the UNet's (a few tokens to thousands; 320-5120 wide), odd sizes, one row, one output.
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
        {2048, 320, 320}, {512, 640, 2560}, {128, 1280, 1280}, {154, 768, 320}, {2, 1280, 1280},
        {1, 3, 1},        {7, 13, 5},       {33, 1283, 17},    {1025, 40, 96}};
    for (const auto& [rows, in, out] : shapes) {
        for (bool with_bias : {true, false}) {
            const auto x = at::randn({rows, in}), w = at::randn({out, in}) / std::sqrt(double(in));
            const c10::optional<at::Tensor> b = with_bias ? c10::optional<at::Tensor>(at::randn({out}))
                                                          : c10::nullopt;
            std::vector<float> y(rows * out);
            ASSERT_TRUE(sd::kernels::linear_f32(x.data_ptr<float>(), rows, in, w.data_ptr<float>(), out,
                                                with_bias ? b->data_ptr<float>() : nullptr, y.data()))
                << rows << "x" << in << "x" << out;
            const auto got = at::from_blob(y.data(), {rows, out}, at::kFloat).clone();
            EXPECT_LT(scaled_error(got, x, w, b), 1e-6) << rows << "x" << in << "x" << out << " bias " << with_bias;
            // The operator gives the kernel's result, bit for bit.
            EXPECT_TRUE(at::equal(sd::fast_linear(x, w, b), got)) << rows << "x" << in << "x" << out;
        }
    }
}

TEST(FastLinear, BatchedAndStridedInputs) {
    at::manual_seed(4);
    const auto w = at::randn({24, 40}), b = at::randn({24});
    const auto x3 = at::randn({2, 77, 40});
    const auto y3 = sd::fast_linear(x3, w, b);
    EXPECT_EQ(y3.sizes(), (std::vector<int64_t>{2, 77, 24}));
    EXPECT_LT(scaled_error(y3, x3, w, b), 1e-6);
    const auto strided = at::randn({2, 40, 77}).transpose(1, 2);  // rows not dense
    EXPECT_LT(scaled_error(sd::fast_linear(strided, w, b), strided, w, b), 1e-6);
    const auto wt = at::randn({40, 24}).t();  // a transposed weight
    EXPECT_LT(scaled_error(sd::fast_linear(x3, wt, c10::nullopt), x3, wt, c10::nullopt), 1e-6);
    const auto empty = at::randn({0, 40});
    EXPECT_EQ(sd::fast_linear(empty, w, b).sizes(), (std::vector<int64_t>{0, 24}));
}

TEST(FastLinear, OtherTypesTakeLibTorchsPath) {
    at::manual_seed(5);
    const auto x = at::randn({9, 16}, at::kDouble), w = at::randn({4, 16}, at::kDouble), b = at::randn({4}, at::kDouble);
    EXPECT_TRUE(at::equal(sd::fast_linear(x, w, b), at::linear(x, w, b)));
    const auto xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16);
    EXPECT_TRUE(at::equal(sd::fast_linear(xb, wb, c10::nullopt), at::linear(xb, wb, c10::nullopt)));
    EXPECT_THROW(sd::fast_linear(at::randn({3, 5}), at::randn({4, 6}), c10::nullopt), c10::Error);  // widths
}

TEST(FastLinear, RegisteredOperatorRunsTheKernel) {
    sd::register_operators();
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow("sd::linear", "");
    at::manual_seed(6);
    const auto x = at::randn({2, 64, 320}), w = at::randn({640, 320}), b = at::randn({640});
    const auto via_op =
        op.typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&)>().call(x, w, b);
    EXPECT_TRUE(at::equal(via_op, sd::fast_linear(x, w, b)));
}
