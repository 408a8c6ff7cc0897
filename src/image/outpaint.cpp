#include "image/outpaint.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sd/error.h"

namespace sd {

namespace {

int parse_margin(const std::string& part, const std::string& text, const std::string& what) {
    if (part.empty() || part.size() > 5 || part.find_first_not_of("0123456789") != std::string::npos)
        throw Error(what + ": expected four whole numbers LEFT,TOP,RIGHT,BOTTOM, got '" + text + "'");
    const int v = std::stoi(part);
    if (v > 16384) throw Error(what + ": " + part + " pixels is more than the 16384 a side may have");
    return v;
}

// A float plane, row-major.
struct Plane {
    int w = 0, h = 0;
    std::vector<float> v;
};

// One pass of an "extended box" along rows or columns: weight 1 within
// `inner` of the centre, `frac` at inner + 1, normalised; edges clamped.
void box_pass(Plane& p, int inner, double frac, bool along_rows) {
    const int n = along_rows ? p.w : p.h, lines = along_rows ? p.h : p.w;
    const int reach = inner + 1;
    const double norm = 2.0 * inner + 1.0 + 2.0 * frac;
    std::vector<double> prefix(static_cast<size_t>(n + 2 * reach) + 1);
    std::vector<float> line(static_cast<size_t>(n));
    for (int l = 0; l < lines; ++l) {
        auto at = [&](int i) -> float& {
            return along_rows ? p.v[static_cast<size_t>(l) * p.w + i] : p.v[static_cast<size_t>(i) * p.w + l];
        };
        auto clamped = [&](int i) { return static_cast<double>(at(std::clamp(i, 0, n - 1))); };
        // prefix[k] = sum of the clamped line over indices -reach .. k - reach - 1
        prefix[0] = 0;
        for (int k = 0; k < n + 2 * reach; ++k)
            prefix[static_cast<size_t>(k) + 1] = prefix[static_cast<size_t>(k)] + clamped(k - reach);
        for (int i = 0; i < n; ++i) {
            const double core =
                prefix[static_cast<size_t>(i + inner + reach) + 1] - prefix[static_cast<size_t>(i - inner + reach)];
            const double ends = clamped(i - reach) + clamped(i + reach);
            line[static_cast<size_t>(i)] = static_cast<float>((core + frac * ends) / norm);
        }
        for (int i = 0; i < n; ++i) at(i) = line[static_cast<size_t>(i)];
    }
}

// A Gaussian of sigma = radius as three extended box blurs of the same
// variance (sigma^2 / 3 each), along rows and then columns.
void gaussian_blur(Plane& p, double radius) {
    if (radius <= 0) return;
    const double var = radius * radius / 3.0;
    const int inner = static_cast<int>(std::floor((std::sqrt(12.0 * var + 1.0) - 1.0) / 2.0));
    // The box of half-width inner has variance inner (inner + 1) / 3; the ends'
    // weight makes up the rest.
    const double frac =
        (2.0 * inner + 1.0) * (var - inner * (inner + 1.0) / 3.0) / (2.0 * ((inner + 1.0) * (inner + 1.0) - var));
    for (bool rows : {true, false})
        for (int pass = 0; pass < 3; ++pass) box_pass(p, inner, frac, rows);
}

}  // namespace

OutpaintMargins parse_outpaint(const std::string& text, const std::string& what) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        parts.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    if (parts.size() != 4)
        throw Error(what + ": expected four whole numbers LEFT,TOP,RIGHT,BOTTOM, got '" + text + "'");
    OutpaintMargins m{parse_margin(parts[0], text, what), parse_margin(parts[1], text, what),
                      parse_margin(parts[2], text, what), parse_margin(parts[3], text, what)};
    if (m.left + m.top + m.right + m.bottom == 0) throw Error(what + ": all four margins are 0; nothing to outpaint");
    return m;
}

MaskedContent parse_masked_content(const std::string& text, const std::string& what) {
    if (text == "fill") return MaskedContent::Fill;
    if (text == "original") return MaskedContent::Original;
    if (text == "latent-noise") return MaskedContent::LatentNoise;
    if (text == "latent-nothing") return MaskedContent::LatentNothing;
    throw Error(what + ": unknown masked content '" + text +
                "' (choose fill, original, latent-noise or latent-nothing)");
}

bool is_pixel_fill(MaskedContent content) {
    return content == MaskedContent::Fill || content == MaskedContent::Original;
}

OutpaintCanvas outpaint_canvas(const Image& img, const OutpaintMargins& m, MaskedContent content,
                               const std::string& what, int max_side) {
    const int64_t w = static_cast<int64_t>(img.width) + m.left + m.right;
    const int64_t h = static_cast<int64_t>(img.height) + m.top + m.bottom;
    if (w > max_side || h > max_side)
        throw Error(what + ": the canvas would be " + std::to_string(w) + "x" + std::to_string(h) +
                    " pixels; sides up to " + std::to_string(max_side) + " are accepted");
    OutpaintCanvas c;
    c.image = {static_cast<int>(w), static_cast<int>(h), std::vector<uint8_t>(static_cast<size_t>(w * h * 3), 0)};
    c.mask = {static_cast<int>(w), static_cast<int>(h), std::vector<uint8_t>(static_cast<size_t>(w * h), 255)};
    for (int y = 0; y < img.height; ++y) {
        std::copy_n(&img.rgb[static_cast<size_t>(y) * img.width * 3], static_cast<size_t>(img.width) * 3,
                    &c.image.rgb[(static_cast<size_t>(y + m.top) * w + m.left) * 3]);
        std::fill_n(&c.mask.v[static_cast<size_t>(y + m.top) * w + m.left], img.width, uint8_t{0});
    }
    if (content == MaskedContent::Fill) c.image = fill_masked(c.image, c.mask);
    return c;
}

Image fill_masked(const Image& img, const GreyImage& mask) {
    if (mask.width != img.width || mask.height != img.height) throw Error("the mask and the picture differ in size");
    const size_t n = static_cast<size_t>(img.width) * img.height;
    // The picture premultiplied by its alpha (255 - mask): planes R, G, B, A.
    std::vector<Plane> base(4, Plane{img.width, img.height, std::vector<float>(n)});
    for (size_t i = 0; i < n; ++i) {
        const float a = static_cast<float>(255 - mask.v[i]) / 255.0f;
        for (size_t c = 0; c < 3; ++c) base[c].v[i] = static_cast<float>(img.rgb[i * 3 + c]) * a;
        base[3].v[i] = a;
    }
    // The layers composited "over" an empty (transparent) picture, in A1111's order.
    std::vector<float> acc_c(n * 3, 0.0f), acc_a(n, 0.0f);
    const std::pair<int, int> layers[] = {{256, 1}, {64, 1}, {16, 2}, {4, 4}, {2, 2}, {0, 1}};
    for (const auto& [radius, repeats] : layers) {
        std::vector<Plane> b = base;
        for (auto& p : b) gaussian_blur(p, radius);
        for (size_t i = 0; i < n; ++i) {
            const float a = b[3].v[i];
            if (a <= 0) continue;
            for (int r = 0; r < repeats; ++r) {
                const float out_a = a + acc_a[i] * (1 - a);
                for (size_t c = 0; c < 3; ++c) {
                    const float colour = b[c].v[i] / a;  // back from premultiplied
                    acc_c[i * 3 + c] = (colour * a + acc_c[i * 3 + c] * acc_a[i] * (1 - a)) / out_a;
                }
                acc_a[i] = out_a;
            }
        }
    }
    Image out = img;
    for (size_t i = 0; i < n * 3; ++i) out.rgb[i] = static_cast<uint8_t>(std::clamp(std::lround(acc_c[i]), 0L, 255L));
    return out;
}

}  // namespace sd
