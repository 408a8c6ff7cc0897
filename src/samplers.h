// The CompVis PLMS and DDIM (eta = 0) samplers, op for op as ldm's
// plms.py / ddim.py do them in float32, including their random draws.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace sd {

// The guided model output (eps) for x at timesteps t (int64, one per image).
using EpsFn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& t)>;
// Called after each step with the step number (0-based), the step count, x and pred_x0.
using StepFn = std::function<void(int step, int total, const at::Tensor& x, const at::Tensor& pred_x0)>;

struct SamplerSchedule {
    std::vector<float> alphas_cumprod;  // the model's float32 buffer
};

// Number of sampler steps actually run for a requested count (30 -> 31).
int sampler_step_count(int requested_steps, int num_train_timesteps);

// Runs the sampler from x (the start noise). gen is the run's generator: the
// reference draws one randn the size of x per step even with eta = 0 (PLMS one
// more in its first step); those draws are consumed here too so that later
// batches of the same run get the same start noise as the reference.
at::Tensor sample_plms(const EpsFn& eps, at::Tensor x, const std::vector<float>& alphas_cumprod, int steps,
                       at::Generator& gen, const StepFn& on_step = nullptr);
at::Tensor sample_ddim(const EpsFn& eps, at::Tensor x, const std::vector<float>& alphas_cumprod, int steps,
                       at::Generator& gen, const StepFn& on_step = nullptr);

// Dispatch by name ("plms", "ddim"); throws sd::Error for an unknown name.
at::Tensor sample(const std::string& sampler, const EpsFn& eps, at::Tensor x, const std::vector<float>& alphas_cumprod,
                  int steps, at::Generator& gen, const StepFn& on_step = nullptr);

bool is_known_sampler(const std::string& name);
const std::vector<std::string>& sampler_names();

}  // namespace sd
