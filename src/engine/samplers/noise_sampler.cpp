#include "engine/samplers/noise_sampler.h"

#include "sd/error.h"

namespace sd {

namespace {

double value(const at::Tensor& t) { return t.item<float>(); }

// Draws as StepNoise gives them, recorded for whoever listens (--save-noise).
class NotedNoise : public NoiseSampler {
public:
    NotedNoise(std::unique_ptr<NoiseSampler> inner, StepNoise& draws) : inner_(std::move(inner)), draws_(draws) {}
    at::Tensor operator()(const at::Tensor& sigma, const at::Tensor& sigma_next) override {
        at::Tensor noise = (*inner_)(sigma, sigma_next);
        draws_.noted(noise);
        return noise;
    }

private:
    std::unique_ptr<NoiseSampler> inner_;
    StepNoise& draws_;
};

}  // namespace

BrownianTreeNoise::BrownianTreeNoise(const at::Tensor& x, const at::Tensor& sigma_min, const at::Tensor& sigma_max,
                                     const std::vector<uint64_t>& seeds, bool batched, const SeededRandn& randn)
    : batched_(batched) {
    // BatchedBrownianTree.sort
    const bool ascending = value(sigma_min) < value(sigma_max);
    const double t0 = value(ascending ? sigma_min : sigma_max), t1 = value(ascending ? sigma_max : sigma_min);
    sign_ = ascending ? 1 : -1;
    std::vector<int64_t> size = x.sizes().vec();
    if (batched_) size.erase(size.begin());
    for (uint64_t seed : seeds) trees_.emplace_back(t0, t1, seed, size, randn);
}

at::Tensor BrownianTreeNoise::operator()(const at::Tensor& sigma, const at::Tensor& sigma_next) {
    const bool ascending = value(sigma) < value(sigma_next);
    const double ta = value(ascending ? sigma : sigma_next), tb = value(ascending ? sigma_next : sigma);
    std::vector<at::Tensor> ws;
    for (auto& tree : trees_) ws.push_back(tree.increment(ta, tb));
    at::Tensor w = at::stack(ws) * static_cast<int64_t>(sign_ * (ascending ? 1 : -1));
    if (!batched_) w = w[0];
    return w / (sigma_next - sigma).abs().sqrt();
}

std::unique_ptr<NoiseSampler> brownian_noise(const SamplerRun& r, const at::Tensor& x, const at::Tensor& sigmas) {
    const at::Tensor sigma_min = sigmas.masked_select(sigmas > 0).min(), sigma_max = sigmas.max();
    StepNoise& draws = r.draws;
    const SeededRandn randn = [&draws](uint64_t seed, at::IntArrayRef size) { return draws.seeded_randn(seed, size); };
    std::unique_ptr<NoiseSampler> trees;
    if (r.s.brownian_tree == "kdiffusion") {
        const std::vector<uint64_t> seed = {draws.next_tree_seed()};
        trees = std::make_unique<BrownianTreeNoise>(x, sigma_min, sigma_max, seed, false, randn);
    } else if (r.s.brownian_tree == "a1111") {
        if (static_cast<int64_t>(r.s.seeds.size()) != x.size(0))
            throw Error("the web UI's Brownian trees need each image's seed (" + std::to_string(x.size(0)) +
                        " images, " + std::to_string(r.s.seeds.size()) + " seeds)");
        trees = std::make_unique<BrownianTreeNoise>(x, sigma_min, sigma_max, r.s.seeds, true, randn);
    } else {
        throw Error("--brownian-tree must be a1111 or kdiffusion, got \"" + r.s.brownian_tree + "\"");
    }
    return std::make_unique<NotedNoise>(std::move(trees), draws);
}

}  // namespace sd
