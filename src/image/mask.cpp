#include "image/mask.h"

#include <cmath>

#include "sd/error.h"

namespace sd {

namespace {

// OpenCV's BORDER_REFLECT_101: ... 2 1 | 0 1 2 ... n-1 | n-2 n-3 ...
int reflect101(int i, int n) {
    if (n == 1) return 0;
    while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
    return i;
}

// One pass of the separable blur along rows (dx = 1) or columns (dx = 0).
GreyImage blur_pass(const GreyImage& in, const std::vector<double>& k, bool along_rows) {
    GreyImage out = in;
    const int half = static_cast<int>(k.size() / 2);
    for (int y = 0; y < in.height; ++y)
        for (int x = 0; x < in.width; ++x) {
            double acc = 0;
            for (int t = -half; t <= half; ++t) {
                const int sx = along_rows ? reflect101(x + t, in.width) : x;
                const int sy = along_rows ? y : reflect101(y + t, in.height);
                acc += k[t + half] * in.v[static_cast<size_t>(sy) * in.width + sx];
            }
            // Round half to even, as OpenCV's saturate_cast (lrint).
            const long r = std::lrint(acc);
            out.v[static_cast<size_t>(y) * in.width + x] = static_cast<uint8_t>(r < 0 ? 0 : r > 255 ? 255 : r);
        }
    return out;
}

}  // namespace

void check_mask_size(const GreyImage& mask, int image_w, int image_h, const std::string& what) {
    if (mask.width != image_w || mask.height != image_h)
        throw Error(what + ": the mask is " + std::to_string(mask.width) + "x" + std::to_string(mask.height) +
                    " but the picture is " + std::to_string(image_w) + "x" + std::to_string(image_h) +
                    "; they must be the same size");
}

GreyImage invert_mask(const GreyImage& mask) {
    GreyImage out = mask;
    for (auto& v : out.v) v = static_cast<uint8_t>(255 - v);
    return out;
}

int mask_blur_kernel_size(int radius) { return 2 * static_cast<int>(2.5 * radius + 0.5) + 1; }

GreyImage blur_mask(const GreyImage& mask, int radius) {
    if (radius < 0) throw Error("the mask blur must not be negative");
    if (radius == 0 || mask.v.empty()) return mask;
    // cv2.getGaussianKernel(k, sigma): exp(-(i - (k-1)/2)^2 / (2 sigma^2)), summing to 1.
    const int size = mask_blur_kernel_size(radius);
    std::vector<double> k(static_cast<size_t>(size));
    double sum = 0;
    for (int i = 0; i < size; ++i) {
        const double d = i - (size - 1) / 2.0;
        k[static_cast<size_t>(i)] = std::exp(-d * d / (2.0 * radius * radius));
        sum += k[static_cast<size_t>(i)];
    }
    for (auto& w : k) w /= sum;
    return blur_pass(blur_pass(mask, k, true), k, false);
}

std::vector<float> binarize_mask(const GreyImage& mask) {
    std::vector<float> out(mask.v.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(mask.v[i]) / 255.0f >= 0.5f ? 1.0f : 0.0f;
    return out;
}

std::vector<float> latent_mask(const std::vector<float>& mask, int w, int h, int factor) {
    if (factor < 1 || w % factor || h % factor || mask.size() != static_cast<size_t>(w) * h)
        throw Error("the mask's size is not a multiple of the latent factor");
    const int lw = w / factor, lh = h / factor;
    std::vector<float> out(static_cast<size_t>(lw) * lh);
    for (int i = 0; i < lh; ++i)
        for (int j = 0; j < lw; ++j)
            out[static_cast<size_t>(i) * lw + j] =
                mask[static_cast<size_t>(i) * factor * w + static_cast<size_t>(j) * factor];
    return out;
}

std::vector<float> image_to_chw(const Image& img) {
    const size_t n = static_cast<size_t>(img.width) * img.height;
    std::vector<float> out(3 * n);
    for (size_t i = 0; i < n; ++i)
        for (size_t c = 0; c < 3; ++c) {
            // numpy: float32 / 255.0 stays float32; 2.0 * x - 1.0 likewise (2 x is exact).
            const float x = static_cast<float>(img.rgb[i * 3 + c]) / 255.0f;
            out[c * n + i] = 2.0f * x - 1.0f;
        }
    return out;
}

std::vector<float> masked_image_chw(const std::vector<float>& image_chw, const std::vector<float>& mask) {
    if (image_chw.size() != 3 * mask.size()) throw Error("the mask and the picture differ in size");
    std::vector<float> out(image_chw.size());
    const size_t n = mask.size();
    for (size_t c = 0; c < 3; ++c)
        for (size_t i = 0; i < n; ++i) out[c * n + i] = image_chw[c * n + i] * (mask[i] < 0.5f ? 1.0f : 0.0f);
    return out;
}

Image paste_back(const Image& original, const Image& generated, const GreyImage& mask) {
    if (original.width != generated.width || original.height != generated.height || mask.width != original.width ||
        mask.height != original.height)
        throw Error("the picture, the result and the mask differ in size");
    Image out = generated;
    for (size_t i = 0; i < mask.v.size(); ++i) {
        const uint32_t m = mask.v[i];
        for (size_t c = 0; c < 3; ++c) {
            const uint32_t a = generated.rgb[i * 3 + c] * m + original.rgb[i * 3 + c] * (255 - m);
            out.rgb[i * 3 + c] = static_cast<uint8_t>((a + 127) / 255);
        }
    }
    return out;
}

}  // namespace sd
