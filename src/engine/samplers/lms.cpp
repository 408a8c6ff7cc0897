// k-diffusion's sample_lms, order 4: x moves by the last (up to) 4
// derivatives, each weighted by the integral over [sigma_i, sigma_i+1] of its
// Lagrange basis polynomial in sigma. No random draws.
#include <deque>

#include "engine/samplers/k_diffusion.h"

namespace sd {

namespace {

constexpr int kOrder = 4;

// linear_multistep_coeff(order, t, i, j): the integral of
// prod_{k != j} (tau - t[i - k]) / (t[i - j] - t[i - k]) from t[i] to t[i + 1],
// the denominators float32 differences as numpy makes them. scipy's quad
// integrates these cubics exactly; so does 4-point Gauss-Legendre.
double lms_coefficient(int order, const std::vector<float>& t, int i, int j) {
    auto basis = [&](long double tau) {
        long double prod = 1;
        for (int k = 0; k < order; ++k) {
            if (k == j) continue;
            const float den = t[static_cast<size_t>(i - j)] - t[static_cast<size_t>(i - k)];
            prod *= (tau - t[static_cast<size_t>(i - k)]) / static_cast<long double>(den);
        }
        return prod;
    };
    const long double a = t[static_cast<size_t>(i)], b = t[static_cast<size_t>(i + 1)];
    const long double half = (b - a) / 2, mid = (a + b) / 2;
    const long double nodes[] = {0.33998104358485626480L, 0.86113631159405257522L};
    const long double weights[] = {0.65214515486254614263L, 0.34785484513745385737L};
    long double sum = 0;
    for (int n = 0; n < 2; ++n) sum += weights[n] * (basis(mid - half * nodes[n]) + basis(mid + half * nodes[n]));
    return static_cast<double>(half * sum);
}

}  // namespace

at::Tensor sample_lms(const SamplerRun& r) {
    KRun k = k_run(r);
    const at::Tensor& sigmas = k.sigmas;
    const at::Tensor contiguous = sigmas.contiguous();
    const std::vector<float> t(contiguous.data_ptr<float>(), contiguous.data_ptr<float>() + contiguous.numel());
    at::Tensor x = std::move(k.x);
    std::deque<at::Tensor> ds;  // the derivatives of the last steps, newest last
    const int total = static_cast<int>(sigmas.size(0)) - 1;
    for (int i = 0; i < total; ++i) {
        auto denoised = k.denoiser(x, sigmas[i], i);
        ds.push_back(to_d(x, sigmas[i], denoised));
        if (ds.size() > kOrder) ds.pop_front();
        const int order = std::min(i + 1, kOrder);
        // sum(coeff * d for coeff, d in zip(coeffs, reversed(ds)))
        at::Tensor step;
        for (int j = 0; j < order; ++j) {
            auto term = lms_coefficient(order, t, i, j) * ds[ds.size() - 1 - static_cast<size_t>(j)];
            step = j == 0 ? term : step + term;
        }
        x = x + step;
        if (k.after) x = k.after(i, total, std::move(x));
        if (r.on_step) r.on_step(i, total, x, denoised);
    }
    return x;
}

}  // namespace sd
