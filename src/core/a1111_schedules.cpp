#include "core/a1111_schedules.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "sd/error.h"

namespace sd {

namespace {

// numpy's linspace(start, stop, n): start + i * ((stop - start) / (n - 1)), the last exactly stop.
std::vector<double> np_linspace(double start, double stop, int n) {
    std::vector<double> out(static_cast<size_t>(std::max(n, 0)));
    if (n == 1) out[0] = start;
    if (n < 2) return out;
    const double step = (stop - start) / (n - 1);
    for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = i * step + start;
    out.back() = stop;
    return out;
}

// numpy's interp(x, xp, fp) for ascending xp inside [xp[0], xp[-1]].
double np_interp(double x, const std::vector<double>& xp, const std::vector<double>& fp) {
    const size_t last = xp.size() - 1;
    if (x >= xp[last]) return fp[last];
    if (x <= xp[0]) return fp[0];
    size_t j = 0;
    while (j + 1 < last && xp[j + 1] <= x) ++j;
    if (xp[j] == x) return fp[j];
    const double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    return slope * (x - xp[j]) + fp[j];
}

// The regularized incomplete beta function I_x(a, b) by its continued
// fraction (modified Lentz), in long double; for x past the mean the
// symmetric form converges faster.
long double incomplete_beta(long double x, long double a, long double b) {
    if (x <= 0) return 0;
    if (x >= 1) return 1;
    if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(1 - x, b, a);
    const long double log_front =
        a * std::log(x) + b * std::log1p(-x) - (std::lgamma(a) + std::lgamma(b) - std::lgamma(a + b));
    const long double tiny = 1e-300L;
    long double c = 1, d = 1 - (a + b) * x / (a + 1);
    if (std::fabs(d) < tiny) d = tiny;
    d = 1 / d;
    long double f = d;
    for (int m = 1; m <= 10000; ++m) {
        for (int half = 0; half < 2; ++half) {
            // The even and then the odd term of the fraction.
            const long double num = half == 0 ? m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
                                              : -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
            d = 1 + num * d;
            if (std::fabs(d) < tiny) d = tiny;
            c = 1 + num / c;
            if (std::fabs(c) < tiny) c = tiny;
            d = 1 / d;
            f *= d * c;
            if (half == 1 && std::fabs(d * c - 1) < 4e-18L) return std::exp(log_front) * f / a;
        }
    }
    return std::exp(log_front) * f / a;
}

}  // namespace

std::vector<int> simple_schedule_indices(int steps, int num_train_timesteps) {
    const double ss = static_cast<double>(num_train_timesteps) / steps;
    std::vector<int> out;
    for (int k = 0; k < steps; ++k) out.push_back(num_train_timesteps - 1 - static_cast<int>(k * ss));
    return out;
}

std::vector<int> ddim_schedule_indices(int steps, int num_train_timesteps) {
    const int ss = std::max(num_train_timesteps / steps, 1);
    std::vector<int> out;
    for (int x = 1; x < num_train_timesteps; x += ss) out.push_back(x);
    std::reverse(out.begin(), out.end());
    return out;
}

double beta_quantile(double p, double a, double b) {
    if (p <= 0) return 0;
    if (p >= 1) return 1;
    // Bisection down to adjacent doubles: I_x is increasing in x.
    double lo = 0, hi = 1;
    for (int i = 0; i < 2000; ++i) {
        const double mid = 0.5 * (lo + hi);
        if (mid <= lo || mid >= hi) break;
        (incomplete_beta(mid, a, b) < p ? lo : hi) = mid;
    }
    // The nearer of the two.
    const long double e_lo = p - incomplete_beta(lo, a, b), e_hi = incomplete_beta(hi, a, b) - p;
    return e_lo <= e_hi ? lo : hi;
}

std::vector<double> beta_schedule_fractions(int steps, double alpha, double beta) {
    std::vector<double> out;
    for (double t : np_linspace(0, 1, steps)) out.push_back(beta_quantile(1 - t, alpha, beta));
    return out;
}

std::vector<double> align_your_steps_sigmas(int steps, bool sdxl) {
    // NVIDIA's lists (research.nvidia.com/labs/toronto-ai/AlignYourSteps/howto.html), as the web UI has them.
    static const std::vector<double> sd1 = {14.615, 6.475, 3.861, 2.697, 1.886, 1.396,
                                            0.963,  0.652, 0.399, 0.152, 0.029};
    static const std::vector<double> xl = {14.615, 6.315, 3.771, 2.181, 1.342, 0.862,
                                           0.555,  0.380, 0.234, 0.113, 0.029};
    const std::vector<double>& list = sdxl ? xl : sd1;
    if (steps == static_cast<int>(list.size())) return list;
    const std::vector<double> xs = np_linspace(0, 1, static_cast<int>(list.size()));
    std::vector<double> ys;
    for (auto it = list.rbegin(); it != list.rend(); ++it) ys.push_back(std::log(*it));
    std::vector<double> out;
    for (double x : np_linspace(0, 1, steps)) out.push_back(std::exp(np_interp(x, xs, ys)));
    std::reverse(out.begin(), out.end());
    return out;
}

}  // namespace sd
