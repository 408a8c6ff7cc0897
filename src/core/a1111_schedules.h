// The arithmetic of the web UI's sigma schedules that needs no tensors
// (AUTOMATIC1111 modules/sd_schedulers.py, 5bbbda47): which of the model's
// 1000 sigmas Simple and DDIM take, the Beta schedule's quantiles and the
// Align Your Steps list. engine/samplers/k_schedules.cpp makes the sigmas.
#pragma once
#include <vector>

namespace sd {

// simple_scheduler: of the T model sigmas (ascending), entries
// T - 1 - int(k * (T / n)) for k = 0..n-1, noisiest first.
std::vector<int> simple_schedule_indices(int steps, int num_train_timesteps);

// ddim_scheduler: entries 1, 1 + s, 1 + 2s, ... below T with s = max(T // n, 1),
// noisiest first; n + 1 of them when 1 + n s < T (12 steps -> 13).
std::vector<int> ddim_schedule_indices(int steps, int num_train_timesteps);

// beta_scheduler: scipy.stats.beta.ppf(1 - linspace(0, 1, n), alpha, beta),
// the fractions of the way from sigma_min to sigma_max, noisiest first.
std::vector<double> beta_schedule_fractions(int steps, double alpha, double beta);

// The inverse of the regularized incomplete beta function: x with I_x(a, b) = p.
double beta_quantile(double p, double a, double b);

// get_align_your_steps_sigmas without its final 0: NVIDIA's 11-value list for
// SD 1.x/2.x (or SDXL), as given for 11 steps, else log-linearly
// interpolated to n values (numpy's interp over linspace(0, 1, 11)).
std::vector<double> align_your_steps_sigmas(int steps, bool sdxl);

}  // namespace sd
