// Bringing an init picture (and its mask) to the size the run makes: plain
// resampling and AUTOMATIC1111's three resize modes (modules/images.py
// resize_image, modes 0-2).
//
// The resampler is stb_image_resize v1 (Debian 12's libstb-dev) with the
// Catmull-Rom filter in both directions, on the stored values (no sRGB
// linearisation, as PIL), edges clamped. It is not PIL's LANCZOS, which
// CompVis, diffusers and A1111 use: a picture that has to be resized gives
// pixels a few levels away from theirs (measured on the 64x96 init.png of
// img2img/cases/cv_ddim10_s0.3_96x64 against PIL 9.4's LANCZOS: to 64x40,
// 192x128 and 50x50, mean 0.6-0.9 levels, 99th percentile 5-7, largest 9-19 at
// sharp edges). A picture already at the size is returned unchanged, as PIL
// does, so the reference cases are not affected.
#pragma once
#include <string>

#include "sd/image.h"

namespace sd {

enum class ResizeMode {
    Just,  // A1111 "Just resize": stretched to W x H, the aspect ratio not kept
    Crop,  // "Crop and resize": scaled to cover W x H, then the middle cut out
    Fill,  // "Resize and fill": scaled to fit inside W x H, the two empty bands
           // filled with the picture's edge rows (or columns) stretched outwards
};

// "just", "crop" or "fill"; throws sd::Error naming `what` otherwise.
ResizeMode parse_resize_mode(const std::string& text, const std::string& what);
const char* resize_mode_name(ResizeMode mode);

// Resampled to exactly w x h (Catmull-Rom); a copy when the size is already that.
Image resize_image(const Image& img, int w, int h);
GreyImage resize_grey(const GreyImage& img, int w, int h);

// Where the scaled picture lands on the W x H canvas: scaled to scaled_w x
// scaled_h and placed with its top-left corner at (x, y), which is negative
// for Crop (the overhang is cut off) and non-negative for Fill. Integer
// arithmetic exactly as A1111's (floor divisions, the aspect ratios compared
// as doubles).
struct Placement {
    int scaled_w = 0, scaled_h = 0, x = 0, y = 0;
};
Placement resize_placement(int src_w, int src_h, int w, int h, ResizeMode mode);

// The picture brought to w x h by `mode`. A mask of the same size as the
// picture goes through fit_grey with the same mode, so that the two stay
// aligned pixel for pixel (A1111 resizes its mask the same way).
Image fit_image(const Image& img, int w, int h, ResizeMode mode);
GreyImage fit_grey(const GreyImage& img, int w, int h, ResizeMode mode);

// `side` rounded down to a multiple of `multiple` (CompVis img2img.py's
// load_img uses 32, diffusers' VaeImageProcessor 8). May return 0.
int round_down_to_multiple(int side, int multiple);

}  // namespace sd
