// Where a sampler's random draws come from. The samplers ask for each noise
// tensor in the references' order and never touch a generator themselves, so
// that another source (per-image generators, the web UI's GPU generator, a
// Brownian tree) can stand in without touching a sampler.
#pragma once
#include <ATen/ATen.h>

namespace sd {

class StepNoise {
public:
    virtual ~StepNoise() = default;
    // The run's next standard normal draw, float32, shaped like x.
    virtual at::Tensor next(const at::Tensor& x) = 0;
};

// The draws of one CPU generator for the whole batch (the references' way).
class GeneratorNoise : public StepNoise {
public:
    explicit GeneratorNoise(at::Generator& gen) : gen_(gen) {}
    at::Tensor next(const at::Tensor& x) override { return at::randn(x.sizes(), gen_, x.options()); }

private:
    at::Generator& gen_;
};

}  // namespace sd
