#include "image/resize.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sd/error.h"

// stb_image_resize's only implementation in the program.
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_STATIC
#include <stb_image_resize.h>

namespace sd {

namespace {

// Pixels of `channels` bytes, row-major: what Image and GreyImage hold.
struct Plane {
    int w = 0, h = 0, channels = 0;
    std::vector<uint8_t> v;
};

Plane resample(const Plane& src, int w, int h) {
    if (w < 1 || h < 1) throw Error("cannot resize a picture to " + std::to_string(w) + "x" + std::to_string(h));
    if (src.w == w && src.h == h) return src;
    Plane out{w, h, src.channels, std::vector<uint8_t>(static_cast<size_t>(w) * h * src.channels)};
    const int ok = stbir_resize_uint8_generic(src.v.data(), src.w, src.h, 0, out.v.data(), w, h, 0, src.channels,
                                              STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP, STBIR_FILTER_CATMULLROM,
                                              STBIR_COLORSPACE_LINEAR, nullptr);
    if (!ok)
        throw Error("cannot resize a picture to " + std::to_string(w) + "x" + std::to_string(h) + " (out of memory)");
    return out;
}

// Copies src's pixel (sx, sy) to dst's (dx, dy).
void copy_pixel(const Plane& src, int sx, int sy, Plane& dst, int dx, int dy) {
    const size_t c = static_cast<size_t>(src.channels);
    std::copy_n(&src.v[(static_cast<size_t>(sy) * src.w + sx) * c], c,
                &dst.v[(static_cast<size_t>(dy) * dst.w + dx) * c]);
}

Plane fit(const Plane& src, int w, int h, ResizeMode mode) {
    if (mode == ResizeMode::Just) return resample(src, w, h);
    const Placement p = resize_placement(src.w, src.h, w, h, mode);
    const Plane scaled = resample(src, p.scaled_w, p.scaled_h);
    // A1111 pastes onto a new black canvas.
    Plane out{w, h, src.channels, std::vector<uint8_t>(static_cast<size_t>(w) * h * src.channels, 0)};
    for (int y = std::max(0, p.y); y < std::min(h, p.y + p.scaled_h); ++y)
        for (int x = std::max(0, p.x); x < std::min(w, p.x + p.scaled_w); ++x)
            copy_pixel(scaled, x - p.x, y - p.y, out, x, y);
    if (mode != ResizeMode::Fill) return out;
    // The bands above and below (or left and right), each as wide as the
    // offset, filled with the nearest edge row (column) of the scaled picture;
    // the far band starts right after the picture (A1111: fill_height + src_h).
    if (p.scaled_w == w && p.y > 0) {
        for (int y = 0; y < p.y; ++y)
            for (int x = 0; x < w; ++x) copy_pixel(scaled, x, 0, out, x, y);
        for (int y = p.y + p.scaled_h; y < std::min(h, 2 * p.y + p.scaled_h); ++y)
            for (int x = 0; x < w; ++x) copy_pixel(scaled, x, p.scaled_h - 1, out, x, y);
    } else if (p.scaled_h == h && p.x > 0) {
        for (int y = 0; y < h; ++y) {
            for (int x = 0; x < p.x; ++x) copy_pixel(scaled, 0, y, out, x, y);
            for (int x = p.x + p.scaled_w; x < std::min(w, 2 * p.x + p.scaled_w); ++x)
                copy_pixel(scaled, p.scaled_w - 1, y, out, x, y);
        }
    }
    return out;
}

Plane plane_of(const Image& img) { return {img.width, img.height, 3, img.rgb}; }
Plane plane_of(const GreyImage& img) { return {img.width, img.height, 1, img.v}; }
Image image_of(Plane p) { return {p.w, p.h, std::move(p.v)}; }
GreyImage grey_of(Plane p) { return {p.w, p.h, std::move(p.v)}; }

}  // namespace

ResizeMode parse_resize_mode(const std::string& text, const std::string& what) {
    if (text == "just") return ResizeMode::Just;
    if (text == "crop") return ResizeMode::Crop;
    if (text == "fill") return ResizeMode::Fill;
    throw Error(what + ": unknown resize mode '" + text + "' (choose just, crop or fill)");
}

const char* resize_mode_name(ResizeMode mode) {
    switch (mode) {
        case ResizeMode::Just:
            return "just";
        case ResizeMode::Crop:
            return "crop";
        default:
            return "fill";
    }
}

Placement resize_placement(int src_w, int src_h, int w, int h, ResizeMode mode) {
    if (src_w < 1 || src_h < 1 || w < 1 || h < 1) throw Error("cannot place an empty picture");
    Placement p;
    if (mode == ResizeMode::Just) {
        p.scaled_w = w, p.scaled_h = h;
        return p;
    }
    const double ratio = static_cast<double>(w) / h, src_ratio = static_cast<double>(src_w) / src_h;
    // Crop matches the target's width when the picture is relatively taller
    // (so that it covers), Fill when it is relatively wider (so that it fits).
    const bool match_width = mode == ResizeMode::Crop ? ratio > src_ratio : ratio < src_ratio;
    const int64_t sw = src_w, sh = src_h;
    p.scaled_w = match_width ? w : static_cast<int>(sw * h / sh);
    p.scaled_h = match_width ? static_cast<int>(sh * w / sw) : h;
    // A1111 would fail on a zero-sized resize (a 1000x1 picture fitted into 64x64).
    p.scaled_w = std::max(p.scaled_w, 1);
    p.scaled_h = std::max(p.scaled_h, 1);
    p.x = w / 2 - p.scaled_w / 2;
    p.y = h / 2 - p.scaled_h / 2;
    return p;
}

Image resize_image(const Image& img, int w, int h) { return image_of(resample(plane_of(img), w, h)); }
GreyImage resize_grey(const GreyImage& img, int w, int h) { return grey_of(resample(plane_of(img), w, h)); }

Image fit_image(const Image& img, int w, int h, ResizeMode mode) { return image_of(fit(plane_of(img), w, h, mode)); }
GreyImage fit_grey(const GreyImage& img, int w, int h, ResizeMode mode) {
    return grey_of(fit(plane_of(img), w, h, mode));
}

int round_down_to_multiple(int side, int multiple) {
    if (multiple < 1) throw Error("a size multiple must be positive");
    return side - side % multiple;
}

}  // namespace sd
