// k-diffusion's noise_sampler(sigma, sigma_next) for the SDE samplers:
// BrownianTreeNoiseSampler over torchsde's BrownianTree (engine/brownian_tree.h),
// seeded as the web UI does (one tree per image, its seed) or as k-diffusion
// does (one tree for the batch, its seed drawn from the run's generator).
#pragma once
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "engine/brownian_tree.h"
#include "engine/samplers/sampler_run.h"

namespace sd {

class NoiseSampler {
public:
    virtual ~NoiseSampler() = default;
    // The noise of the step from sigma to sigma_next (0-dim float32), shaped like x.
    virtual at::Tensor operator()(const at::Tensor& sigma, const at::Tensor& sigma_next) = 0;
};

// BrownianTreeNoiseSampler(x, sigma_min, sigma_max, seed): trees over
// [sigma_min, sigma_max]; with several seeds one tree of one image's size per
// seed (batched), else one of x's size. noise(s, sn) = W(s, sn) / sqrt(|sn - s|).
class BrownianTreeNoise : public NoiseSampler {
public:
    BrownianTreeNoise(const at::Tensor& x, const at::Tensor& sigma_min, const at::Tensor& sigma_max,
                      const std::vector<uint64_t>& seeds, bool batched, const SeededRandn& randn);
    at::Tensor operator()(const at::Tensor& sigma, const at::Tensor& sigma_next) override;

private:
    std::vector<BrownianTree> trees_;
    bool batched_;
    int sign_;  // -1 when sigma_min > sigma_max
};

// The SDE samplers' noise for a run over these sigmas (sigma_min: the smallest
// non-zero one): SamplerSettings::brownian_tree "a1111" (one tree per image,
// seeded with s.seeds) or "kdiffusion" (one tree, seeded by
// draws.next_tree_seed()); every result is passed to draws.noted().
std::unique_ptr<NoiseSampler> brownian_noise(const SamplerRun& r, const at::Tensor& x, const at::Tensor& sigmas);

}  // namespace sd
