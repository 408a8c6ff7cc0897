// What the bf16 convolution kernels' tests share (tests/kernels/test_winograd_bf16.cpp,
// test_pointwise_bf16.cpp): a case's shape, the error measure, and a tensor's bf16 bits.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

namespace sdtest {

struct ConvCase {
    int64_t n, ic, oc, h, w;
    bool bias;
};

inline double relative_rms(const at::Tensor& got, const at::Tensor& want) {
    const auto d = got.to(at::kDouble) - want.to(at::kDouble);
    return std::sqrt(d.pow(2).mean().item<double>() / want.to(at::kDouble).pow(2).mean().item<double>());
}

inline uint16_t* bf16_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

}  // namespace sdtest
