// What every sampler function gets (one per row of core/sampler_list.h, each
// defined in engine/sampling_loop.cpp or engine/samplers/<function>.cpp), and
// their declarations, made from the list itself.
#pragma once
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "core/sampler_list.h"
#include "engine/sampling_loop.h"
#include "engine/step_noise.h"

namespace sd {

// Called after step `i` of `total` (the steps of this run) with x; returns
// the x the next step starts from (inpainting's blend), or x itself.
using AfterStep = std::function<at::Tensor(int i, int total, at::Tensor x)>;

// One run's inputs, the same for every sampler function.
struct SamplerRun {
    const SamplerSettings& s;  // its schedule is the one that runs ("automatic" resolved)
    const ModelFn& model;
    at::Tensor noise;
    const std::vector<float>& ac;
    StepNoise& draws;
    const StepFn& on_step;
    at::Tensor x0;    // img2img / inpainting: the init latents, noise's size; undefined: txt2img
    at::Tensor mask;  // inpainting's latent blend; undefined: none

    bool img2img() const { return x0.defined(); }
    // txt2img, and the blend at strength 1.0 (diffusers' is_strength_max),
    // start from the noise alone (times the schedule's initial sigma).
    bool from_noise() const { return !x0.defined() || (mask.defined() && s.strength == 1.0); }
};

// The inpainting blend (InpaintBlend) after step i of total: noised_after(i)
// gives the init latents at the level x has after step i.
AfterStep blend_after(const SamplerRun& r, std::function<at::Tensor(int i)> noised_after);

inline at::Tensor timestep_tensor(int64_t b, int t) { return at::full({b}, static_cast<int64_t>(t), at::kLong); }

#define SD_SAMPLER_DECLARE(function, ...) at::Tensor sample_##function(const SamplerRun& r);
SD_SAMPLERS(SD_SAMPLER_DECLARE)
#undef SD_SAMPLER_DECLARE

}  // namespace sd
