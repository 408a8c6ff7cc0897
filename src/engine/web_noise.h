// Where a run's noise comes from: each batch's start noise and every draw its
// sampler makes (StepNoise). By default the tool's own CPU generator, as
// before; with NoiseSettings (--rng, --ensd, --subseed, --seed-resize-from) the
// way AUTOMATIC1111's web UI draws it (modules/rng.py, ImageRNG): its CPU or
// NV (GPU Philox, core/philox.h) source, the eta noise seed delta, a variation
// seed blended in by slerp, and noise drawn at an older size pasted centred.
//
// One seed's draws are the web UI's for one image. In per-image seed mode each
// image is a batch of its own and the pipeline is re-seeded with its seed, so
// every image has its own generator, exactly as the web UI's batches do. In
// compvis mode one seed's generator serves the whole run, each draw being the
// whole batch's [n, C, h, w] tensor (what a GPU's torch.randn gives).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "core/philox.h"
#include "engine/step_noise.h"
#include "sd/settings.h"

namespace sd {

// True when s asks for anything but the tool's own draws from its CPU generator.
bool uses_web_noise(const NoiseSettings& s);

// The web UI's slerp (rng.py) of one image's noise [C, h, w] toward `high` by
// val: each normalised over dim 1, and its linear fallback (with the weights
// as it has them) when the two nearly agree. float32 tensor ops, as there.
at::Tensor web_slerp(double val, const at::Tensor& low, const at::Tensor& high);

// One random stream: LibTorch's CPU generator, or the NV (Philox) one.
class RandomStream {
public:
    RandomStream(bool nv, uint64_t seed);
    at::Tensor randn(at::IntArrayRef shape);

private:
    std::optional<at::Generator> cpu_;
    std::optional<PhiloxGenerator> nv_;
};

// The web UI's ImageRNG for one seed (a variation seed, if any, beside it):
// first() gives the start noise, next() each later draw, each one tensor of
// the shape asked for.
class SeedNoise {
public:
    SeedNoise(const NoiseSettings& s, uint64_t seed);
    // shape [n, C, h, w]; factor: pixels per latent pixel (seed resize).
    at::Tensor first(at::IntArrayRef shape, int64_t factor);
    at::Tensor next(at::IntArrayRef shape) { return main_.randn(shape); }
    const NoiseSettings& settings() const { return s_; }

private:
    NoiseSettings s_;
    uint64_t seed_;
    bool nv_;
    RandomStream main_;
    // The variation seed's generator and the old size's (fresh ones in the
    // web UI, drawn once per image; here kept for a compvis run's later batches).
    std::optional<RandomStream> sub_, old_size_;
    bool reseeded_ = false;  // ENSD applied
};

// What the pipeline holds for a run: seeded by Pipeline::seed, asked for each
// batch's start noise, then handing the sampler its draws. With record on it
// keeps the batch's start noise and draws for --save-noise.
class RunNoise {
public:
    void seed(uint64_t seed);
    uint64_t seed() const { return seed_; }  // the run's (compvis) or the image's (per-image) seed
    void record(bool on) { record_ = on; }

    // The start noise of a batch, shape [n, C, h, w]. With the tool's own draws
    // that is `drawn` when the caller drew it from gen already (a picture's
    // start), else a draw from gen. Begins the batch's draws (steps()).
    at::Tensor start(const NoiseSettings& s, at::Generator& gen, at::IntArrayRef shape, int64_t factor,
                     const at::Tensor& drawn = {});
    // The sampler's source for the batch begun by start().
    StepNoise& steps() { return draws_; }
    // The batch's start noise and then every draw, as drawn: [1 + D, n, C, h, w]
    // (undefined unless recording). Throws sd::Error when the draws differ in shape.
    at::Tensor recorded() const;

private:
    class Draws : public StepNoise {
    public:
        at::Tensor next(const at::Tensor& x) override;
        // The Brownian tree's hooks (step_noise.h): k-diffusion's tree seed from the
        // tool's own generator; a node's draw from a fresh generator of the source's
        // kind (the web UI's randn_local); the tree's noise kept for --save-noise.
        uint64_t next_tree_seed() override;
        at::Tensor seeded_randn(uint64_t seed, at::IntArrayRef size) override;
        void noted(const at::Tensor& noise) override;
        std::optional<GeneratorNoise> gen;  // the tool's own draws
        SeedNoise* lane = nullptr;          // or the web UI's
        std::vector<at::Tensor>* log = nullptr;
    };
    uint64_t seed_ = 0;
    std::optional<SeedNoise> lane_;
    bool record_ = false;
    std::vector<at::Tensor> log_;
    Draws draws_;
};

}  // namespace sd
