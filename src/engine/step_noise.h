// Where a sampler's random draws come from. The samplers ask for each noise
// tensor in the references' order and never touch a generator themselves, so
// that another source (per-image generators, the web UI's GPU generator, a
// Brownian tree) can stand in without touching a sampler.
#pragma once
#include <cstdint>

#include <ATen/ATen.h>

#include "sd/error.h"

namespace sd {

class StepNoise {
public:
    virtual ~StepNoise() = default;
    // The run's next standard normal draw, float32, shaped like x.
    virtual at::Tensor next(const at::Tensor& x) = 0;

    // The SDE samplers' Brownian trees (engine/brownian_tree.h):
    // k-diffusion's own tree seed, torch.randint(0, 2**63 - 1, []) from the
    // run's stream right after the start noise (--brownian-tree kdiffusion).
    virtual uint64_t next_tree_seed() {
        throw Error("this noise source cannot seed k-diffusion's Brownian tree (use --brownian-tree a1111)");
    }
    // A tree node's draw: standard normal float32 of this size from a fresh
    // generator seeded `seed` (torchsde's _randn; the web UI's randn_local).
    virtual at::Tensor seeded_randn(uint64_t seed, at::IntArrayRef size) {
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
        return at::randn(size, gen, at::TensorOptions(at::kFloat));
    }
    // Told every noise tensor a sampler adds that did not come from next()
    // (the Brownian tree's, as drawn, before any scaling), in order.
    virtual void noted(const at::Tensor& noise) { (void)noise; }
};

// The draws of one CPU generator for the whole batch (the references' way).
class GeneratorNoise : public StepNoise {
public:
    explicit GeneratorNoise(at::Generator& gen) : gen_(gen) {}
    at::Tensor next(const at::Tensor& x) override { return at::randn(x.sizes(), gen_, x.options()); }
    uint64_t next_tree_seed() override {
        // Python's int(randint(0, 2**63 - 1, [])): two 32-bit draws, modulo 2^63 - 1.
        return static_cast<uint64_t>(at::randint(0, INT64_MAX, {}, gen_, at::TensorOptions(at::kLong)).item<int64_t>());
    }

private:
    at::Generator& gen_;
};

}  // namespace sd
