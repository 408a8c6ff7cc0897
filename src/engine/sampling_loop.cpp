#include "engine/sampling_loop.h"

#include <cmath>

#include "sd/error.h"
#include "core/sampler_list.h"
#include "core/schedule.h"
#include "sd/sampler_catalog.h"

namespace sd {

namespace {

// ---------------------------------------------------------------- CompVis PLMS / DDIM

// Per-step constants, as ldm's make_ddim_sampling_parameters builds them:
// alphas = alphas_cumprod[t], alphas_prev = [alphas_cumprod[0]] + alphas[:-1],
// sqrt_one_minus_alphas = sqrt(1 - alphas) in float32; sigmas are 0 (eta = 0).
struct StepTable {
    std::vector<int> timesteps;  // ascending
    std::vector<float> alphas, alphas_prev, sqrt_one_minus_alphas;
};

StepTable make_table(const std::vector<float>& ac, int steps, const std::string& spacing) {
    StepTable s;
    s.timesteps = compvis_timesteps(steps, static_cast<int>(ac.size()), spacing);
    for (size_t i = 0; i < s.timesteps.size(); ++i) {
        float a = ac.at(static_cast<size_t>(s.timesteps[i]));
        s.alphas.push_back(a);
        s.alphas_prev.push_back(i == 0 ? ac[0] : ac[static_cast<size_t>(s.timesteps[i - 1])]);
        s.sqrt_one_minus_alphas.push_back(std::sqrt(1.0f - a));
    }
    return s;
}

// ldm's get_x_prev_and_pred_x0 with sigma_t = 0; draws (and discards, since it
// is multiplied by sigma_t = 0) the noise tensor the reference draws. A v
// model's DDIM passes its own pred_x0 (ddim.py computes it from v directly).
std::pair<at::Tensor, at::Tensor> ddim_update(const at::Tensor& x, const at::Tensor& e_t, const StepTable& s, int64_t index,
                                              at::Generator& gen, at::Tensor pred_x0 = {}) {
    const int64_t b = x.size(0);
    auto opts = x.options();
    auto a_t = at::full({b, 1, 1, 1}, s.alphas[index], opts);
    auto a_prev = at::full({b, 1, 1, 1}, s.alphas_prev[index], opts);
    auto sqrt_one_minus_at = at::full({b, 1, 1, 1}, s.sqrt_one_minus_alphas[index], opts);
    if (!pred_x0.defined()) pred_x0 = (x - sqrt_one_minus_at * e_t) / a_t.sqrt();
    auto dir_xt = (1.0 - a_prev).sqrt() * e_t;
    at::randn(x.sizes(), gen, opts);
    auto x_prev = a_prev.sqrt() * pred_x0 + dir_xt;
    return {x_prev, pred_x0};
}

at::Tensor timestep_tensor(int64_t b, int t) { return at::full({b}, static_cast<int64_t>(t), at::kLong); }

// sqrt(a_t) and sqrt(1 - a_t) as ldm's float32 buffers sqrt_alphas_cumprod and
// sqrt_one_minus_alphas_cumprod (square roots taken in double precision).
std::pair<float, float> v_coefficients(const std::vector<float>& ac, const at::Tensor& t) {
    const double a = ac.at(static_cast<size_t>(t[0].item<int64_t>()));
    return {static_cast<float>(std::sqrt(a)), static_cast<float>(std::sqrt(1.0 - a))};
}

// eps from a v model's output at (x, t): predict_eps_from_z_and_v of ddpm.py.
EpsFn v_to_eps(const ModelFn& model, const std::vector<float>& ac) {
    return [&model, &ac](const at::Tensor& x, const at::Tensor& t) {
        auto [sa, s1a] = v_coefficients(ac, t);
        return sa * model(x, t) + s1a * x;
    };
}

at::Tensor run_ddim(const ModelFn& model, Parameterization p, at::Tensor x, const std::vector<float>& ac, int steps,
                    const std::string& spacing, at::Generator& gen, const StepFn& on_step) {
    const StepTable s = make_table(ac, steps, spacing);
    const int total = static_cast<int>(s.timesteps.size());
    for (int i = 0; i < total; ++i) {
        const int64_t index = total - i - 1;
        auto t = timestep_tensor(x.size(0), s.timesteps[index]);
        auto out = model(x, t);
        at::Tensor e_t = out, pred_x0;
        if (p == Parameterization::V) {
            auto [sa, s1a] = v_coefficients(ac, t);
            e_t = sa * out + s1a * x;
            pred_x0 = sa * x - s1a * out;
        }
        auto [x_prev, x0] = ddim_update(x, e_t, s, index, gen, pred_x0);
        x = x_prev;
        if (on_step) on_step(i, total, x, x0);
    }
    return x;
}

at::Tensor run_plms(const EpsFn& eps, at::Tensor x, const std::vector<float>& ac, int steps, const std::string& spacing,
                    at::Generator& gen, const StepFn& on_step) {
    const StepTable s = make_table(ac, steps, spacing);
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

// ---------------------------------------------------------------- k-diffusion

// Sigmas are 0-dim float32 tensors and every formula is written with the
// reference's tensor ops, so that the float32 rounding is the reference's.
// CompVisDenoiser (eps) / CompVisVDenoiser (v) around the guided model:
// D(x, sigma, step) with c_in = 1 / sqrt(sigma^2 + 1) and the continuous
// timestep. With step_t (--schedule trailing) it is diffusers' Euler
// schedulers instead: x / sqrt(sigma^2 + 1) and the step's own timestep.
// Whose sampler code a k-sampler follows: k-diffusion's (continuous timesteps),
// diffusers' (--schedule trailing) or sgm's (SDXL).
enum class Flavour { KDiffusion, Diffusers, Sgm };

struct Denoiser {
    const ModelFn& model;
    Parameterization p;
    at::Tensor log_sigmas;
    std::vector<int> step_t;  // diffusers, sgm: each step's timestep; empty: k-diffusion's sigma_to_t
    Flavour flavour = Flavour::KDiffusion;

    at::Tensor operator()(const at::Tensor& x, const at::Tensor& sigma, int step) const {
        const int64_t b = x.size(0);
        auto s = sigma * at::ones({b}, at::kFloat);  // sigmas[i] * s_in
        auto s4 = s.view({b, 1, 1, 1});
        auto sum = at::pow(s4, 2) + 1.0;  // sigma^2 + sigma_data^2
        at::Tensor out;
        if (flavour == Flavour::KDiffusion) {
            auto c_in = 1.0 / at::pow(sum, 0.5);
            out = model(x * c_in, sigma_to_t(s, log_sigmas));
        } else if (flavour == Flavour::Sgm) {  // EpsScaling's c_in and the sigma's index in the table
            auto c_in = 1.0 / at::pow(sum, 0.5);
            out = model(x * c_in, at::full({b}, static_cast<int64_t>(step_t.at(static_cast<size_t>(step))), at::kLong));
        } else {  // scale_model_input, and the float timestep diffusers passes
            out = model(x / at::pow(sum, 0.5), at::full({b}, static_cast<float>(step_t.at(static_cast<size_t>(step))), at::kFloat));
        }
        if (p == Parameterization::Eps) return x + out * (-s4);  // c_out = -sigma
        auto c_skip = 1.0 / sum;
        auto c_out = -s4 * 1.0 / at::pow(sum, 0.5);
        return x * c_skip + out * c_out;
    }
};

at::Tensor to_d(const at::Tensor& x, const at::Tensor& sigma, const at::Tensor& denoised) { return (x - denoised) / sigma; }

at::Tensor run_euler(const Denoiser& D, at::Tensor x, const at::Tensor& sigmas, at::Generator& gen, const StepFn& on_step) {
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        // k-diffusion draws it even with s_churn = 0; sgm's EulerEDMSampler does not.
        if (D.flavour != Flavour::Sgm) at::randn(x.sizes(), gen, x.options());
        auto sigma = sigmas[i] * 1.0;  // sigma_hat = sigma * (gamma + 1), gamma = 0
        auto denoised = D(x, sigma, i);
        auto d = to_d(x, sigma, denoised);
        x = x + d * (sigmas[i + 1] - sigma);
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

// k-diffusion's sample_euler_ancestral; diffusers' EulerAncestralDiscreteScheduler
// step draws its noise in every step (the last one's multiplied by sigma_up = 0)
// and does not clamp sigma_up; sgm's EulerAncestralSampler clamps it and draws
// in every step, the last one's discarded.
at::Tensor run_euler_ancestral(const Denoiser& D, at::Tensor x, const at::Tensor& sigmas, at::Generator& gen,
                               const StepFn& on_step) {
    const bool diffusers = D.flavour == Flavour::Diffusers, sgm = D.flavour == Flavour::Sgm;
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto from = sigmas[i], to = sigmas[i + 1];
        auto denoised = D(x, from, i);
        // get_ancestral_step with eta = 1
        auto up = at::pow(at::pow(to, 2) * (at::pow(from, 2) - at::pow(to, 2)) / at::pow(from, 2), 0.5);
        if (!diffusers && to.item<float>() < up.item<float>()) up = to;
        auto down = at::pow(at::pow(to, 2) - at::pow(up, 2), 0.5);
        auto d = to_d(x, from, denoised);
        x = x + d * (down - from);
        if (sgm) {
            auto noise = at::randn(x.sizes(), gen, x.options());
            if (to.item<float>() > 0) x = x + noise * 1.0 * up;
        } else if (diffusers || to.item<float>() > 0) {
            x = x + at::randn(x.sizes(), gen, x.options()) * 1.0 * up;
        }
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

at::Tensor run_dpmpp_2m(const Denoiser& D, at::Tensor x, const at::Tensor& sigmas, const StepFn& on_step) {
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    auto t_of = [](const at::Tensor& sigma) { return sigma.log().neg(); };
    auto sigma_of = [](const at::Tensor& t) { return t.neg().exp(); };
    at::Tensor old_denoised;
    for (int i = 0; i < total; ++i) {
        auto denoised = D(x, sigmas[i], i);
        auto t = t_of(sigmas[i]), t_next = t_of(sigmas[i + 1]);
        auto h = t_next - t;
        auto ratio = sigma_of(t_next) / sigma_of(t);
        if (!old_denoised.defined() || sigmas[i + 1].item<float>() == 0) {
            x = ratio * x - (-h).expm1() * denoised;
        } else {
            auto h_last = t - t_of(sigmas[i - 1]);
            auto r = h_last / h;
            auto denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised;
            x = ratio * x - (-h).expm1() * denoised_d;
        }
        old_denoised = denoised;
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

// ---------------------------------------------------------------- LCM

// diffusers' LCMScheduler: x_T is the start noise (init sigma 1), the UNet gets
// x and the integer t; each step's denoised = c_out pred_x0 + c_skip x is
// noised again to the next timestep of the list with a fresh draw, except in
// the last step, whose denoised is the result.
at::Tensor run_lcm(const ModelFn& model, Parameterization p, at::Tensor x, const std::vector<float>& ac, int steps,
                   at::Generator& gen, const StepFn& on_step) {
    const std::vector<int> ts = lcm_timesteps(steps, static_cast<int>(ac.size()));
    const int total = static_cast<int>(ts.size());
    for (int i = 0; i < total; ++i) {
        const int t = ts[static_cast<size_t>(i)];
        auto out = model(x, timestep_tensor(x.size(0), t));
        auto a_t = at::scalar_tensor(ac.at(static_cast<size_t>(t)), at::kFloat);
        auto b_t = 1 - a_t;
        auto pred_x0 = p == Parameterization::Eps ? (x - b_t.sqrt() * out) / a_t.sqrt() : a_t.sqrt() * x - b_t.sqrt() * out;
        auto [c_skip, c_out] = lcm_scalings(t);
        auto denoised = c_out * pred_x0 + c_skip * x;
        if (i + 1 < total) {
            auto a_prev = at::scalar_tensor(ac.at(static_cast<size_t>(ts[static_cast<size_t>(i) + 1])), at::kFloat);
            auto noise = at::randn(x.sizes(), gen, x.options());
            x = a_prev.sqrt() * denoised + (1 - a_prev).sqrt() * noise;
        } else {
            x = denoised;
        }
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

// One run's inputs, the same for every sampler function.
struct SamplerRun {
    const SamplerSettings& s;
    const ModelFn& model;
    at::Tensor noise;
    const std::vector<float>& ac;
    at::Generator& gen;
    const StepFn& on_step;
};

// The k-samplers start from noise scaled by the first of their sigmas.
struct KStart {
    at::Tensor sigmas;
    Denoiser denoiser;
    at::Tensor x;
};

// With --schedule trailing the start is diffusers' init_noise_sigma, the
// largest sigma, which for these descending sigmas is sigmas[0] as well; sgm
// starts at sqrt(1 + sigma_0^2) (prepare_sampling_loop).
KStart k_start(const SamplerRun& r) {
    const int T = static_cast<int>(r.ac.size());
    if (r.s.sgm && r.s.schedule == "default") {
        at::Tensor sigmas = sgm_sigmas(r.s.steps, r.ac, r.s.linear_start, r.s.linear_end);
        at::Tensor x = r.noise * at::sqrt(1.0 + at::pow(sigmas[0], 2.0));
        Denoiser d{r.model, r.s.parameterization, {}, sgm_timesteps(r.s.steps, T), Flavour::Sgm};
        return {sigmas, std::move(d), std::move(x)};
    }
    at::Tensor sigmas = k_sigmas(r.s.schedule, r.s.steps, r.ac);
    at::Tensor x = r.noise * sigmas[0];
    if (r.s.schedule == "trailing")
        return {sigmas, Denoiser{r.model, r.s.parameterization, {}, trailing_timesteps(r.s.steps, T), Flavour::Diffusers},
                std::move(x)};
    return {sigmas, Denoiser{r.model, r.s.parameterization, model_sigmas(r.ac).log(), {}, Flavour::KDiffusion}, std::move(x)};
}

// One function per row of core/sampler_list.h.
at::Tensor sample_plms(const SamplerRun& r) {
    const bool v = r.s.parameterization == Parameterization::V;
    return run_plms(v ? v_to_eps(r.model, r.ac) : r.model, r.noise, r.ac, r.s.steps, r.s.schedule, r.gen, r.on_step);
}

at::Tensor sample_ddim(const SamplerRun& r) {
    return run_ddim(r.model, r.s.parameterization, r.noise, r.ac, r.s.steps, r.s.schedule, r.gen, r.on_step);
}

at::Tensor sample_euler(const SamplerRun& r) {
    KStart k = k_start(r);
    return run_euler(k.denoiser, std::move(k.x), k.sigmas, r.gen, r.on_step);
}

at::Tensor sample_euler_a(const SamplerRun& r) {
    KStart k = k_start(r);
    return run_euler_ancestral(k.denoiser, std::move(k.x), k.sigmas, r.gen, r.on_step);
}

at::Tensor sample_dpmpp_2m(const SamplerRun& r) {
    KStart k = k_start(r);
    return run_dpmpp_2m(k.denoiser, std::move(k.x), k.sigmas, r.on_step);
}

at::Tensor sample_lcm(const SamplerRun& r) {
    return run_lcm(r.model, r.s.parameterization, r.noise, r.ac, r.s.steps, r.gen, r.on_step);
}

}  // namespace

// ---------------------------------------------------------------- public

Parameterization parse_parameterization(const std::string& name) {
    if (name == "eps") return Parameterization::Eps;
    if (name == "v") return Parameterization::V;
    throw Error("unknown parameterization '" + name + "' in model.json (expected eps or v)");
}

at::Tensor model_sigmas(const std::vector<float>& ac) {
    auto a = at::tensor(ac, at::kFloat);
    return at::pow((1 - a) / a, 0.5);
}

at::Tensor k_sigmas(const std::string& schedule, int steps, const std::vector<float>& ac) {
    if (steps < 1) throw Error("steps must be at least 1, got " + std::to_string(steps));
    auto sigmas = model_sigmas(ac);
    const int64_t T = sigmas.size(0);
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
        const double min_inv_rho = std::pow(static_cast<double>(sigmas[0].item<float>()), 1 / rho);
        const double max_inv_rho = std::pow(static_cast<double>(sigmas[T - 1].item<float>()), 1 / rho);
        auto ramp = at::linspace(0.0, 1.0, steps, at::kFloat);
        s = at::pow(ramp * (min_inv_rho - max_inv_rho) + max_inv_rho, rho);
    } else if (schedule == "trailing") {
        // diffusers' Euler schedulers: the model's sigmas at the trailing timesteps
        // (np.interp at whole timesteps is the table's value).
        const auto ts = trailing_timesteps(steps, static_cast<int>(T));
        s = sigmas.index_select(0, at::tensor(std::vector<int64_t>(ts.begin(), ts.end()), at::kLong));
    } else {
        throw Error("unknown schedule '" + schedule + "' (choose default, karras or trailing)");
    }
    return at::cat({s, at::zeros({1}, at::kFloat)});
}

at::Tensor sgm_sigmas(int steps, const std::vector<float>& ac32, double linear_start, double linear_end) {
    const int64_t T = static_cast<int64_t>(ac32.size());
    at::Tensor ac;
    if (linear_start > 0) {
        // make_beta_schedule("linear"): torch.linspace of the square roots in
        // float64, squared; alphas_cumprod = np.cumprod(1 - betas).
        auto betas = at::pow(at::linspace(std::sqrt(linear_start), std::sqrt(linear_end), T, at::kDouble), 2);
        ac = at::cumprod(1.0 - betas, 0);
    } else {
        ac = at::tensor(ac32, at::kFloat).to(at::kDouble);
    }
    const auto ts = sgm_timesteps(steps, static_cast<int>(T));
    ac = ac.index_select(0, at::tensor(std::vector<int64_t>(ts.begin(), ts.end()), at::kLong));
    // (1 - a) / a in float64, made float32, then the square root in float32.
    auto s = at::pow(((1.0 - ac) / ac).to(at::kFloat), 0.5);
    return at::cat({s, at::zeros({1}, at::kFloat)});
}

// LCMScheduler's boundary-condition scalings at integer timestep t
// (timestep_scaling 10, sigma_data 0.5), as its float32 tensor ops round them.
std::pair<at::Tensor, at::Tensor> lcm_scalings(int t) {
    auto scaled = at::scalar_tensor(static_cast<double>(t), at::kFloat) * 10.0;
    auto den = at::pow(scaled, 2) + 0.25;
    auto c_skip = at::reciprocal(den) * 0.25;  // python's 0.25 / tensor
    auto c_out = scaled / at::pow(den, 0.5);
    return {c_skip, c_out};
}

at::Tensor sigma_to_t(const at::Tensor& sigma, const at::Tensor& log_sigmas) {
    auto flat = sigma.reshape({-1});
    auto log_sigma = flat.log();
    auto dists = log_sigma - log_sigmas.unsqueeze(1);  // [T, n]
    // Last index whose log sigma is <= log_sigma (0 below the table), at most T - 2.
    auto low_idx = dists.ge(0).cumsum(0).argmax(0).clamp_max(log_sigmas.size(0) - 2);
    auto high_idx = low_idx + 1;
    auto low = log_sigmas.index_select(0, low_idx), high = log_sigmas.index_select(0, high_idx);
    auto w = ((low - log_sigma) / (low - high)).clamp(0, 1);
    auto t = (1 - w) * low_idx + w * high_idx;
    return t.view(sigma.sizes());
}

at::Tensor sample(const SamplerSettings& s, const ModelFn& model, at::Tensor noise, const std::vector<float>& ac,
                  at::Generator& gen, const StepFn& on_step) {
    check_sampler_settings(s.sampler, s.schedule);
    using Fn = at::Tensor (*)(const SamplerRun&);
#define SD_SAMPLER_FN(function, name, a1111, family, schedules) {name, &sample_##function},
    static const std::pair<const char*, Fn> functions[] = {SD_SAMPLERS(SD_SAMPLER_FN)};
#undef SD_SAMPLER_FN
    const SamplerRun run{s, model, std::move(noise), ac, gen, on_step};
    for (const auto& [name, fn] : functions)
        if (s.sampler == name) return fn(run);
    throw Error("unknown sampler '" + s.sampler + "'");  // check_sampler_settings refused it already
}

}  // namespace sd
