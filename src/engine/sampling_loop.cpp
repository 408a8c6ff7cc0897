#include "engine/sampling_loop.h"

#include <algorithm>
#include <cmath>

#include "core/img2img_schedule.h"
#include "core/sampler_list.h"
#include "core/schedule.h"
#include "engine/samplers/sampler_run.h"
#include "sd/error.h"
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
// is multiplied by sigma_t = 0) the noise tensor the reference draws, unless
// draw is false (diffusers' DDIMScheduler with eta 0). A v model's DDIM passes
// its own pred_x0 (ddim.py computes it from v directly).
std::pair<at::Tensor, at::Tensor> ddim_update(const at::Tensor& x, const at::Tensor& e_t, const StepTable& s,
                                              int64_t index, StepNoise& draws, at::Tensor pred_x0 = {},
                                              bool draw = true) {
    const int64_t b = x.size(0);
    auto opts = x.options();
    auto a_t = at::full({b, 1, 1, 1}, s.alphas[index], opts);
    auto a_prev = at::full({b, 1, 1, 1}, s.alphas_prev[index], opts);
    auto sqrt_one_minus_at = at::full({b, 1, 1, 1}, s.sqrt_one_minus_alphas[index], opts);
    if (!pred_x0.defined()) pred_x0 = (x - sqrt_one_minus_at * e_t) / a_t.sqrt();
    auto dir_xt = (1.0 - a_prev).sqrt() * e_t;
    if (draw) draws.next(x);
    auto x_prev = a_prev.sqrt() * pred_x0 + dir_xt;
    return {x_prev, pred_x0};
}

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

// DDIM from entry `first` of the ascending table down to entry 0 (txt2img:
// the top entry). CompVis draws a (discarded) noise tensor in every step,
// diffusers' DDIMScheduler with eta 0 none.
at::Tensor run_ddim(const ModelFn& model, Parameterization p, at::Tensor x, const std::vector<float>& ac,
                    const StepTable& s, int first, bool draw, StepNoise& draws, const AfterStep& after,
                    const StepFn& on_step) {
    const int total = first + 1;
    for (int i = 0; i < total; ++i) {
        const int64_t index = first - i;
        auto t = timestep_tensor(x.size(0), s.timesteps[index]);
        auto out = model(x, t);
        at::Tensor e_t = out, pred_x0;
        if (p == Parameterization::V) {
            auto [sa, s1a] = v_coefficients(ac, t);
            e_t = sa * out + s1a * x;
            pred_x0 = sa * x - s1a * out;
        }
        auto [x_prev, x0] = ddim_update(x, e_t, s, index, draws, pred_x0, draw);
        x = x_prev;
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, x0);
    }
    return x;
}

at::Tensor run_plms(const EpsFn& eps, at::Tensor x, const std::vector<float>& ac, int steps, const std::string& spacing,
                    StepNoise& draws, const StepFn& on_step) {
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
            auto trial = ddim_update(x, e_t, s, index, draws);
            auto e_next = eps(trial.first, timestep_tensor(b, s.timesteps[std::max<int64_t>(index - 1, 0)]));
            e_prime = (e_t + e_next) / 2;
        } else if (n == 1) {
            e_prime = (3 * e_t - old_eps[0]) / 2;
        } else if (n == 2) {
            e_prime = (23 * e_t - 16 * old_eps[1] + 5 * old_eps[0]) / 12;
        } else {
            e_prime = (55 * e_t - 59 * old_eps[n - 1] + 37 * old_eps[n - 2] - 9 * old_eps[n - 3]) / 24;
        }
        auto [x_prev, pred_x0] = ddim_update(x, e_prime, s, index, draws);
        x = x_prev;
        old_eps.push_back(e_t);
        if (old_eps.size() > 3) old_eps.erase(old_eps.begin());
        if (on_step) on_step(i, total, x, pred_x0);
    }
    return x;
}

// ---------------------------------------------------------------- LCM

// diffusers' LCMScheduler: x_T is the start noise (init sigma 1), the UNet gets
// x and the integer t; each step's denoised = c_out pred_x0 + c_skip x is
// noised again to the next timestep of the list with a fresh draw, except in
// the last step, whose denoised is the result. img2img starts at entry `first`.
at::Tensor run_lcm(const ModelFn& model, Parameterization p, at::Tensor x, const std::vector<float>& ac,
                   const std::vector<int>& ts, int first, StepNoise& draws, const AfterStep& after,
                   const StepFn& on_step) {
    const int count = static_cast<int>(ts.size()), total = count - first;
    for (int i = 0; i < total; ++i) {
        const size_t k = static_cast<size_t>(first + i);
        const int t = ts[k];
        auto out = model(x, timestep_tensor(x.size(0), t));
        auto a_t = at::scalar_tensor(ac.at(static_cast<size_t>(t)), at::kFloat);
        auto b_t = 1 - a_t;
        auto pred_x0 =
            p == Parameterization::Eps ? (x - b_t.sqrt() * out) / a_t.sqrt() : a_t.sqrt() * x - b_t.sqrt() * out;
        auto [c_skip, c_out] = lcm_scalings(t);
        auto denoised = c_out * pred_x0 + c_skip * x;
        if (i + 1 < total) {
            auto a_prev = at::scalar_tensor(ac.at(static_cast<size_t>(ts[k + 1])), at::kFloat);
            auto noise = draws.next(x);
            x = a_prev.sqrt() * denoised + (1 - a_prev).sqrt() * noise;
        } else {
            x = denoised;
        }
        if (after) x = after(i, total, std::move(x));
        if (on_step) on_step(i, total, x, denoised);
    }
    return x;
}

// DDIMScheduler's and LCMScheduler's add_noise at alphas_cumprod value a (float32).
at::Tensor vp_noised(const at::Tensor& x0, const at::Tensor& noise, float a) {
    return std::sqrt(a) * x0 + std::sqrt(1.0f - a) * noise;
}

}  // namespace

// The rows of core/sampler_list.h whose function is here (the others: engine/samplers/).
at::Tensor sample_plms(const SamplerRun& r) {
    const bool v = r.s.parameterization == Parameterization::V;
    return run_plms(v ? v_to_eps(r.model, r.ac) : r.model, r.noise, r.ac, r.s.steps, r.s.schedule, r.draws, r.on_step);
}

at::Tensor sample_ddim(const SamplerRun& r) {
    const StepTable table = make_table(r.ac, r.s.steps, r.s.schedule);
    const int count = static_cast<int>(table.timesteps.size());
    const Parameterization p = r.s.parameterization;
    if (!r.img2img()) return run_ddim(r.model, p, r.noise, r.ac, table, count - 1, true, r.draws, nullptr, r.on_step);
    // Entries of the ascending table: the one x is noised to and the first step run.
    int level = 0, first = 0;
    const bool compvis = r.s.schedule == "default";
    if (compvis) {
        const int t_enc = compvis_t_enc(r.s.strength, r.s.steps);
        // img2img.py fails with an index error when t_enc is past the table
        // (strength 1.0 with exactly `steps` entries). A user asking for full
        // strength expects the whole schedule: x is noised to the top entry
        // and every step runs from there (as diffusers does at strength 1.0).
        if (t_enc >= count) {
            level = first = count - 1;
        } else {
            level = t_enc;  // and t_enc = 0 runs no step: the noised latents are the result
            first = t_enc - 1;
        }
    } else {
        const int t_start = diffusers_t_start(r.s.strength, count);
        if (t_start == count) return r.x0;  // strength * steps < 1: no step runs
        level = first = count - 1 - t_start;
    }
    auto noised = [&](int j) { return vp_noised(r.x0, r.noise, table.alphas[static_cast<size_t>(j)]); };
    at::Tensor x = r.from_noise() ? r.noise : noised(level);
    return run_ddim(r.model, p, x, r.ac, table, first, compvis, r.draws,
                    blend_after(r, [&](int i) { return noised(first - i - 1); }), r.on_step);
}

at::Tensor sample_lcm(const SamplerRun& r) {
    const std::vector<int> ts = lcm_timesteps(r.s.steps, static_cast<int>(r.ac.size()));
    const Parameterization p = r.s.parameterization;
    if (!r.img2img()) return run_lcm(r.model, p, r.noise, r.ac, ts, 0, r.draws, nullptr, r.on_step);
    const int count = static_cast<int>(ts.size());
    const int t_start = diffusers_t_start(r.s.strength, count);
    if (t_start == count) return r.x0;
    auto noised = [&](int k) {
        return vp_noised(r.x0, r.noise, r.ac.at(static_cast<size_t>(ts[static_cast<size_t>(k)])));
    };
    at::Tensor x = r.from_noise() ? r.noise : noised(t_start);
    return run_lcm(r.model, p, x, r.ac, ts, t_start, r.draws,
                   blend_after(r, [&](int i) { return noised(t_start + i + 1); }), r.on_step);
}

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

std::pair<at::Tensor, std::vector<int>> dpm_karras_schedule(int steps, const std::vector<float>& ac) {
    if (steps < 1) throw Error("steps must be at least 1, got " + std::to_string(steps));
    // The float32 table and its float32 logs, as numpy holds them.
    const at::Tensor table = model_sigmas(ac), log_table = table.log();
    const int64_t T = table.size(0);
    const float* sig = table.data_ptr<float>();
    const float* log_sig = log_table.data_ptr<float>();
    const double rho = 7.0;
    const double min_inv_rho = std::pow(static_cast<double>(sig[0]), 1 / rho);
    const double max_inv_rho = std::pow(static_cast<double>(sig[T - 1]), 1 / rho);
    std::vector<float> sigmas;
    std::vector<int> ts;
    for (int i = 0; i < steps; ++i) {
        // np.linspace(0, 1, steps): i * (1 / (steps - 1)), the last exactly 1.
        const double ramp = steps == 1 ? 0.0 : i == steps - 1 ? 1.0 : i * (1.0 / (steps - 1));
        const double sigma = std::pow(max_inv_rho + ramp * (min_inv_rho - max_inv_rho), rho);
        // _sigma_to_t: interpolate log sigma between the table's neighbours
        // (the last entry whose log is <= it, at most T - 2), then round.
        const double log_sigma = std::log(std::max(sigma, 1e-10));
        int64_t low = 0;
        for (int64_t k = 0; k < T; ++k)
            if (log_sigma - log_sig[k] >= 0) low = k;
        low = std::min<int64_t>(low, T - 2);
        const double w =
            std::clamp((log_sig[low] - log_sigma) / static_cast<double>(log_sig[low] - log_sig[low + 1]), 0.0, 1.0);
        ts.push_back(
            static_cast<int>(std::nearbyint((1 - w) * static_cast<double>(low) + w * static_cast<double>(low + 1))));
        sigmas.push_back(static_cast<float>(sigma));
    }
    sigmas.push_back(0.0f);
    return {at::tensor(sigmas, at::kFloat), ts};
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
                  StepNoise& draws, const StepFn& on_step, const at::Tensor& init_latents, const InpaintBlend* blend) {
    check_sampler_settings(s.sampler, s.schedule);
    check_beta_parameter("the Beta schedule's alpha", s.beta_alpha);
    check_beta_parameter("the Beta schedule's beta", s.beta_beta);
    using Fn = at::Tensor (*)(const SamplerRun&);
#define SD_SAMPLER_FN(function, name, ...) {name, &sample_##function},
    static const std::pair<const char*, Fn> functions[] = {SD_SAMPLERS(SD_SAMPLER_FN)};
#undef SD_SAMPLER_FN
    // The sampler functions see the schedule that runs ("automatic" is the sampler's own).
    SamplerSettings runs = s;
    runs.schedule = effective_schedule(s.sampler, s.schedule);
    SamplerRun run{runs, model, std::move(noise), ac, draws, on_step, {}, {}};
    if (blend && !init_latents.defined()) throw Error("inpainting's latent blend needs the image latents");
    if (init_latents.defined()) {
        img2img_step_count(s.sampler, s.schedule, s.steps, s.strength,
                           static_cast<int>(ac.size()));  // refuses what cannot run
        // [1 or n, C, h, w] against noise's [n, C, h, w]
        auto fits = [&](const at::Tensor& t, int64_t channels) {
            const auto& n = run.noise;
            return t.dim() == 4 && (t.size(0) == 1 || t.size(0) == n.size(0)) && t.size(1) == channels &&
                   t.size(2) == n.size(2) && t.size(3) == n.size(3);
        };
        if (!fits(init_latents, run.noise.size(1)))
            throw Error("the init latents' shape " + std::string(c10::str(init_latents.sizes())) +
                        " does not fit the noise's " + std::string(c10::str(run.noise.sizes())));
        run.x0 = init_latents.to(at::kFloat).expand(run.noise.sizes()).contiguous();
        if (blend) {
            if (!blend->mask.defined() || !fits(blend->mask, 1))
                throw Error("the inpainting mask must be [1 or n, 1, h, w] at the latents' size");
            run.mask = blend->mask.to(at::kFloat);
        }
    }
    for (const auto& [name, fn] : functions)
        if (s.sampler == name) return fn(run);
    throw Error("unknown sampler '" + s.sampler + "'");  // check_sampler_settings refused it already
}

at::Tensor sample(const SamplerSettings& s, const ModelFn& model, at::Tensor noise, const std::vector<float>& ac,
                  at::Generator& gen, const StepFn& on_step, const at::Tensor& init_latents,
                  const InpaintBlend* blend) {
    GeneratorNoise draws(gen);
    return sample(s, model, std::move(noise), ac, draws, on_step, init_latents, blend);
}

}  // namespace sd
