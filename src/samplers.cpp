#include "samplers.h"

#include <cmath>

#include "error.h"
#include "schedule.h"

namespace sd {

namespace {

// Per-step constants, as ldm's make_ddim_sampling_parameters builds them:
// alphas = alphas_cumprod[t], alphas_prev = [alphas_cumprod[0]] + alphas[:-1],
// sqrt_one_minus_alphas = sqrt(1 - alphas) in float32; sigmas are 0 (eta = 0).
struct StepTable {
    std::vector<int> timesteps;  // ascending
    std::vector<float> alphas, alphas_prev, sqrt_one_minus_alphas;
};

StepTable make_table(const std::vector<float>& ac, int steps) {
    StepTable s;
    s.timesteps = compvis_timesteps(steps, static_cast<int>(ac.size()));
    for (size_t i = 0; i < s.timesteps.size(); ++i) {
        float a = ac.at(static_cast<size_t>(s.timesteps[i]));
        s.alphas.push_back(a);
        s.alphas_prev.push_back(i == 0 ? ac[0] : ac[static_cast<size_t>(s.timesteps[i - 1])]);
        s.sqrt_one_minus_alphas.push_back(std::sqrt(1.0f - a));
    }
    return s;
}

// ldm's get_x_prev_and_pred_x0 with sigma_t = 0; draws (and discards, since it
// is multiplied by sigma_t = 0) the noise tensor the reference draws.
std::pair<at::Tensor, at::Tensor> ddim_update(const at::Tensor& x, const at::Tensor& e_t, const StepTable& s, int64_t index,
                                              at::Generator& gen) {
    const int64_t b = x.size(0);
    auto opts = x.options();
    auto a_t = at::full({b, 1, 1, 1}, s.alphas[index], opts);
    auto a_prev = at::full({b, 1, 1, 1}, s.alphas_prev[index], opts);
    auto sqrt_one_minus_at = at::full({b, 1, 1, 1}, s.sqrt_one_minus_alphas[index], opts);
    auto pred_x0 = (x - sqrt_one_minus_at * e_t) / a_t.sqrt();
    auto dir_xt = (1.0 - a_prev).sqrt() * e_t;
    at::randn(x.sizes(), gen, opts);
    auto x_prev = a_prev.sqrt() * pred_x0 + dir_xt;
    return {x_prev, pred_x0};
}

at::Tensor timestep_tensor(int64_t b, int t) { return at::full({b}, static_cast<int64_t>(t), at::kLong); }

}  // namespace

int sampler_step_count(int requested_steps, int num_train_timesteps) {
    return static_cast<int>(compvis_timesteps(requested_steps, num_train_timesteps).size());
}

at::Tensor sample_ddim(const EpsFn& eps, at::Tensor x, const std::vector<float>& ac, int steps, at::Generator& gen,
                       const StepFn& on_step) {
    const StepTable s = make_table(ac, steps);
    const int total = static_cast<int>(s.timesteps.size());
    for (int i = 0; i < total; ++i) {
        const int64_t index = total - i - 1;
        auto e_t = eps(x, timestep_tensor(x.size(0), s.timesteps[index]));
        auto [x_prev, pred_x0] = ddim_update(x, e_t, s, index, gen);
        x = x_prev;
        if (on_step) on_step(i, total, x, pred_x0);
    }
    return x;
}

at::Tensor sample_plms(const EpsFn& eps, at::Tensor x, const std::vector<float>& ac, int steps, at::Generator& gen,
                       const StepFn& on_step) {
    const StepTable s = make_table(ac, steps);
    const int total = static_cast<int>(s.timesteps.size());
    std::vector<at::Tensor> old_eps;  // guided eps of earlier steps, newest last
    for (int i = 0; i < total; ++i) {
        const int64_t index = total - i - 1;
        const int64_t b = x.size(0);
        auto e_t = eps(x, timestep_tensor(b, s.timesteps[index]));
        at::Tensor e_prime;
        const size_t n = old_eps.size();
        if (n == 0) {
            // Pseudo improved Euler: a trial step, the model again at its end
            // (at the next timestep), then the mean of both slopes.
            auto trial = ddim_update(x, e_t, s, index, gen);
            auto e_next = eps(trial.first, timestep_tensor(b, s.timesteps[std::max<int64_t>(index - 1, 0)]));
            e_prime = (e_t + e_next) / 2;
        } else if (n == 1) {
            e_prime = (3 * e_t - old_eps[0]) / 2;
        } else if (n == 2) {
            e_prime = (23 * e_t - 16 * old_eps[1] + 5 * old_eps[0]) / 12;
        } else {
            e_prime = (55 * e_t - 59 * old_eps[n - 1] + 37 * old_eps[n - 2] - 9 * old_eps[n - 3]) / 24;
        }
        auto [x_prev, pred_x0] = ddim_update(x, e_prime, s, index, gen);
        x = x_prev;
        old_eps.push_back(e_t);
        if (old_eps.size() > 3) old_eps.erase(old_eps.begin());
        if (on_step) on_step(i, total, x, pred_x0);
    }
    return x;
}

const std::vector<std::string>& sampler_names() {
    static const std::vector<std::string> names = {"plms", "ddim"};
    return names;
}

bool is_known_sampler(const std::string& name) {
    for (const auto& n : sampler_names())
        if (n == name) return true;
    return false;
}

at::Tensor sample(const std::string& sampler, const EpsFn& eps, at::Tensor x, const std::vector<float>& ac, int steps,
                  at::Generator& gen, const StepFn& on_step) {
    if (sampler == "plms") return sample_plms(eps, std::move(x), ac, steps, gen, on_step);
    if (sampler == "ddim") return sample_ddim(eps, std::move(x), ac, steps, gen, on_step);
    throw Error("unknown sampler '" + sampler + "' (choose plms or ddim)");
}

}  // namespace sd
