// Which timesteps an img2img (or inpaint) run noises to and denoises from,
// for a strength 0 < s <= 1, under the two references'
// arithmetic (../shared/conformance/img2img/README.md).
#pragma once
#include <string>
#include <vector>

namespace sd {

// 0 < strength <= 1 and finite; throws sd::Error naming `what` otherwise.
double check_strength(const std::string& what, double strength);

// CompVis scripts/img2img.py: t_enc = int(strength * S), Python's float product
// truncated (0.58 x 50 = 28.999999999999996 gives 28).
int compvis_t_enc(double strength, int steps);

// CompVis img2img with DDIM (--sampler ddim --schedule default):
// stochastic_encode noises the image latents to ddim_timesteps[t_enc], then
// decode runs DDIM over ddim_timesteps[t_enc - 1], ..., ddim_timesteps[0]: the
// latents are noised one DDIM step higher than the first step that denoises
// them (10 steps, strength 0.75: noised to 701, denoised from 601).
// strength < 1 / S gives t_enc = 0: no step runs and the noised latents (at
// timestep ddim_timesteps[0]) are decoded, as in the original.
//
// Where the original crashes (t_enc = len(ddim_timesteps), e.g. strength 1.0
// with 10 steps: "index 10 is out of bounds"), the run starts from pure noise
// at the top of the schedule, as txt2img does: pure_noise is set, every DDIM
// timestep is run from the highest down, and the picture plays no part. The
// engine should then draw the start noise as txt2img does (no encoder draw), so
// that strength 1.0 gives the txt2img image of the same seed. When S does not
// divide 1000 the schedule has one entry more than S (15 -> 16) and strength
// 1.0 does not crash the original: it is followed (noised to the top entry, S
// steps from the one below).
struct CompVisImg2ImgPlan {
    int t_enc = 0;               // int(strength * S)
    bool pure_noise = false;     // see above
    int noise_timestep = -1;     // ddim_timesteps[t_enc] (-1 with pure_noise)
    std::vector<int> indices;    // indices into ddim_timesteps of the steps run, in order (t_enc - 1 down to 0)
    std::vector<int> timesteps;  // ddim_timesteps at those indices
};
// ddim_timesteps ascending, as compvis_timesteps (core/schedule.h) gives them;
// steps = the S asked for (--steps), which t_enc is computed from.
CompVisImg2ImgPlan compvis_img2img_plan(const std::vector<int>& ddim_timesteps, int steps, double strength);

// diffusers' get_timesteps (pipeline_stable_diffusion_img2img.py 656-663, the
// inpaint pipeline's too): init_timestep = min(int(S * strength), S),
// t_start = max(S - init_timestep, 0); the run uses scheduler.timesteps[t_start
// * order:] and noises to its first entry, which is also the first step run
// (add_noise at latent_timestep = timesteps[t_start]). Strength 1.0 runs all S
// steps and still mixes in the picture (except the 9-channel inpaint pipeline,
// which starts from noise times init_noise_sigma there).
struct DiffusersImg2ImgPlan {
    int init_timestep = 0;
    int t_start = 0;  // index of the first step run in the scheduler's S timesteps
};
DiffusersImg2ImgPlan diffusers_img2img_plan(int steps, double strength);

// timesteps[t_start * order:], for a scheduler's full list (descending, as diffusers keeps them).
template <class T>
std::vector<T> diffusers_img2img_timesteps(const std::vector<T>& all, const DiffusersImg2ImgPlan& plan, int order = 1) {
    const size_t from = static_cast<size_t>(plan.t_start) * static_cast<size_t>(order);
    return from >= all.size() ? std::vector<T>{} : std::vector<T>(all.begin() + static_cast<long>(from), all.end());
}

}  // namespace sd
