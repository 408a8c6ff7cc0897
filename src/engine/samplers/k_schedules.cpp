// The k-samplers' sigma schedules (k_sigmas, engine/sampling_loop.h): those of
// k-diffusion's sampling.py and of the web UI's sd_schedulers.py, each with
// the reference's own float32 tensor ops (or its float64 arithmetic, rounded
// to float32 at the end, where the reference computes in Python or numpy).
#include <algorithm>
#include <cmath>

#include "core/a1111_schedules.h"
#include "core/schedule.h"
#include "engine/sampling_loop.h"
#include "sd/error.h"

namespace sd {

namespace {

at::Tensor append_zero(const at::Tensor& s) { return at::cat({s, at::zeros({1}, at::kFloat)}); }

at::Tensor entries(const at::Tensor& table, const std::vector<int>& idx) {
    return table.index_select(0, at::tensor(std::vector<int64_t>(idx.begin(), idx.end()), at::kLong));
}

// torch.FloatTensor of Python floats: each rounded to float32.
at::Tensor float32_of(const std::vector<double>& values) {
    std::vector<float> f(values.begin(), values.end());
    return at::tensor(f, at::kFloat);
}

// CompVisDenoiser.t_to_sigma of one 0-dim timestep (the web UI calls it per entry).
at::Tensor t_to_sigma(const at::Tensor& t, const at::Tensor& log_sigmas) {
    const int64_t low = t.floor().item<float>(), high = t.ceil().item<float>();
    auto w = t.frac();
    return ((1 - w) * log_sigmas.select(0, low) + w * log_sigmas.select(0, high)).exp();
}

// sgm_uniform (n + 1 timesteps, the last dropped) and normal (n timesteps):
// linspace(sigma_to_t(sigma_max), sigma_to_t(sigma_min)), each entry through t_to_sigma.
at::Tensor timestep_schedule(const at::Tensor& table, int count, int keep) {
    const auto log_sigmas = table.log();
    const int64_t T = table.size(0);
    const double start = sigma_to_t(table[T - 1].clone(), log_sigmas).item<double>();
    const double end = sigma_to_t(table[0].clone(), log_sigmas).item<double>();
    const at::Tensor ts = at::linspace(start, end, count, at::kFloat);
    std::vector<at::Tensor> sigmas;
    for (int i = 0; i < keep; ++i) sigmas.push_back(t_to_sigma(ts[i], log_sigmas));
    return at::stack(sigmas);
}

}  // namespace

at::Tensor k_sigmas(const std::string& schedule, int steps, const std::vector<float>& ac, const KScheduleOptions& o) {
    if (steps < 1) throw Error("steps must be at least 1, got " + std::to_string(steps));
    auto sigmas = model_sigmas(ac);
    const int64_t T = sigmas.size(0);
    // The web UI's sigma_min and sigma_max: Python floats of the float32 table's ends.
    const double sigma_min = sigmas[0].item<float>(), sigma_max = sigmas[T - 1].item<float>();
    at::Tensor s;
    if (schedule == "default") {
        // get_sigmas: t_to_sigma(linspace(T - 1, 0, steps))
        auto t = at::linspace(static_cast<double>(T - 1), 0.0, steps, at::kFloat);
        auto low = t.floor().to(at::kLong), high = t.ceil().to(at::kLong);
        auto w = t.frac();
        auto log_sigmas = sigmas.log();
        s = ((1 - w) * log_sigmas.index_select(0, low) + w * log_sigmas.index_select(0, high)).exp();
    } else if (schedule == "karras") {
        const double rho = 7.0;
        const double min_inv_rho = std::pow(sigma_min, 1 / rho);
        const double max_inv_rho = std::pow(sigma_max, 1 / rho);
        auto ramp = at::linspace(0.0, 1.0, steps, at::kFloat);
        s = at::pow(ramp * (min_inv_rho - max_inv_rho) + max_inv_rho, rho);
    } else if (schedule == "exponential") {
        s = at::linspace(std::log(sigma_max), std::log(sigma_min), steps, at::kFloat).exp();
    } else if (schedule == "polyexponential") {
        const double rho = 1.0;  // the web UI's default_rho
        auto ramp = at::pow(at::linspace(1, 0, steps, at::kFloat), rho);
        s = at::exp(ramp * (std::log(sigma_max) - std::log(sigma_min)) + std::log(sigma_min));
    } else if (schedule == "sgm_uniform") {
        s = timestep_schedule(sigmas, steps + 1, steps);
    } else if (schedule == "normal") {
        s = timestep_schedule(sigmas, steps, steps);
    } else if (schedule == "simple") {
        s = entries(sigmas, simple_schedule_indices(steps, static_cast<int>(T)));
    } else if (schedule == "ddim") {
        s = entries(sigmas, ddim_schedule_indices(steps, static_cast<int>(T)));
    } else if (schedule == "beta") {
        std::vector<double> values;
        for (double x : beta_schedule_fractions(steps, o.beta_alpha, o.beta_beta))
            values.push_back(sigma_min + x * (sigma_max - sigma_min));
        s = float32_of(values);
    } else if (schedule == "align_your_steps") {
        s = float32_of(align_your_steps_sigmas(steps, o.sdxl));
    } else if (schedule == "kl_optimal") {
        // Evenly spaced in atan(sigma), steps + 1 of them, ending at sigma_min: no 0 is appended.
        auto alpha_min = at::arctan(at::scalar_tensor(sigma_min, at::kFloat));
        auto alpha_max = at::arctan(at::scalar_tensor(sigma_max, at::kFloat));
        auto step_indices = at::arange(steps + 1, at::kLong);
        return at::tan(step_indices / steps * alpha_min + (1.0 - step_indices / steps) * alpha_max);
    } else if (schedule == "trailing" || schedule == "leading") {
        // diffusers' Euler schedulers: the model's sigmas at the timesteps
        // (np.interp at whole timesteps is the table's value).
        auto ts = schedule == "trailing" ? trailing_timesteps(steps, static_cast<int>(T))
                                         : compvis_timesteps(steps, static_cast<int>(T), "leading");
        if (schedule == "leading") std::reverse(ts.begin(), ts.end());
        s = entries(sigmas, ts);
    } else {
        throw Error("unknown schedule '" + schedule + "'");
    }
    return append_zero(s);
}

}  // namespace sd
