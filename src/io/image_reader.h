// Pictures the user hands in (--init-img, --mask): PNG, JPEG or BMP, decoded
// with stb_image and converted the way the references' PIL converts them
// (Image.open(f).convert("RGB") for a picture, convert("L") for a mask).
//
// What the conversions do (checked against PIL 9.4 on crafted files,
// tests/unit/test_image_reader.cpp):
//  - alpha is dropped, never composited over a background (RGBA -> RGB keeps
//    the colour of a fully transparent pixel); a palette's transparency too;
//  - grey (1, 2, 4, 8 bit) is replicated into R, G and B; low bit depths are
//    scaled to 0..255 (2 bit: 0, 85, 170, 255);
//  - 16-bit RGB, RGBA and grey+alpha PNGs keep the high byte of each sample;
//    16-bit grey PNGs without alpha are clamped to 255 (PIL opens them as 32-bit
//    integers and convert() saturates), so a 16-bit grey picture of mid-grey
//    32768 becomes white, as it does in PIL;
//  - a mask in colour becomes PIL's ITU-R 601-2 luma in fixed point,
//    (19595 R + 38470 G + 7471 B + 32768) >> 16;
//  - EXIF orientation is not applied (PIL's Image.open does not apply it either);
//    exif_orientation() reads it, so that a run can warn.
// JPEG pixels come from stb_image's own IDCT and chroma upsampling, not
// libjpeg's: they may differ from PIL's by a few levels. CMYK JPEGs are
// converted by stb_image's rule, not PIL's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sd/image.h"

namespace sd {

// Limits checked before any pixel is decoded (from the header alone).
struct PictureLimits {
    size_t max_file_bytes = size_t(1) << 30;
    int max_side = 16384;
    int64_t max_pixels = 256'000'000;  // 256 megapixels (a 16384 x 16384 picture is 268 and refused)
};

// Decodes a whole file held in memory. `name` starts every message, e.g.
// "--init-img photo.png". Throws sd::Error with one line for anything it
// cannot use: not PNG, JPEG or BMP; a side or a total over the limits;
// truncated or corrupt data.
Image decode_image(std::string_view bytes, const std::string& name, const PictureLimits& limits = {});
GreyImage decode_mask(std::string_view bytes, const std::string& name, const PictureLimits& limits = {});

// The EXIF orientation a JPEG (APP1) or PNG (eXIf) records: 1 (as stored) to 8
// (rotated or mirrored), or 0 where it records none or it cannot be read. The
// pictures are decoded as stored whatever it says, as the references' PIL
// Image.open reads them; this is for telling the user.
int exif_orientation(std::string_view bytes);
// The same from the first MiB of a file (0 where it cannot be read).
int exif_orientation_of_file(const std::string& path);

// The same for a file: `what` names the option ("--init-img"); the file is
// read with read_file_capped (regular files only, at most max_file_bytes).
Image read_image(const std::string& path, const std::string& what, const PictureLimits& limits = {});
GreyImage read_mask(const std::string& path, const std::string& what, const PictureLimits& limits = {});

}  // namespace sd
