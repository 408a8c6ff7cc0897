#include "image/lanczos.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sd {

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kLobes = 3.0;

double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= kPi;
    return std::sin(x) / x;
}

double lanczos(double x) { return (x > -kLobes && x < kLobes) ? sinc(x) * sinc(x / kLobes) : 0.0; }

// For each output position along one side: the first input index and the
// normalised weights of the inputs it takes.
struct Taps {
    std::vector<int> first;
    std::vector<std::vector<double>> weights;
};

Taps taps(int in, int out) {
    const double scale = static_cast<double>(in) / out;
    const double widen = std::max(scale, 1.0);  // shrinking: the kernel covers more inputs
    const double support = kLobes * widen;
    Taps t;
    for (int i = 0; i < out; ++i) {
        const double center = (i + 0.5) * scale;
        const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
        const int hi = std::min(static_cast<int>(center + support + 0.5), in);
        std::vector<double> w;
        double sum = 0;
        for (int j = lo; j < hi; ++j) {
            w.push_back(lanczos((j - center + 0.5) / widen));
            sum += w.back();
        }
        if (sum != 0)
            for (double& v : w) v /= sum;
        t.first.push_back(lo);
        t.weights.push_back(std::move(w));
    }
    return t;
}

uint8_t to_byte(double v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); }

// One pass along x (horizontal) or y: src is sw x sh, the result ow x oh.
Image resample(const Image& src, int ow, int oh, bool horizontal) {
    Image out;
    out.width = ow;
    out.height = oh;
    out.rgb.resize(static_cast<size_t>(ow) * oh * 3);
    const Taps t = horizontal ? taps(src.width, ow) : taps(src.height, oh);
    for (int y = 0; y < oh; ++y)
        for (int x = 0; x < ow; ++x) {
            const int k = horizontal ? x : y;
            for (int c = 0; c < 3; ++c) {
                double acc = 0;
                for (size_t j = 0; j < t.weights[k].size(); ++j) {
                    const int sx = horizontal ? t.first[k] + static_cast<int>(j) : x;
                    const int sy = horizontal ? y : t.first[k] + static_cast<int>(j);
                    acc += t.weights[k][j] * src.rgb[(static_cast<size_t>(sy) * src.width + sx) * 3 + c];
                }
                out.rgb[(static_cast<size_t>(y) * ow + x) * 3 + c] = to_byte(acc);
            }
        }
    return out;
}

}  // namespace

Image lanczos_resize(const Image& img, int w, int h) {
    Image out = img;
    if (out.width != w) out = resample(out, w, out.height, true);
    if (out.height != h) out = resample(out, w, h, false);
    return out;
}

}  // namespace sd
