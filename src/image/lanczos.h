// The Lanczos resampler of the hires fix's "lanczos" upscaler (A1111's
// "Lanczos" upscaler is PIL's Image.resize with LANCZOS): a = 3, the kernel
// widened by the scale when shrinking, rows first, then columns, each pass
// rounded to 8 bits as PIL's does. Written after PIL's description, not its
// code: values may differ from PIL's by a level where its fixed-point
// coefficients round otherwise.
#pragma once
#include "sd/image.h"

namespace sd {

// The picture resampled to exactly w x h (a copy when it already has that size).
Image lanczos_resize(const Image& img, int w, int h);

}  // namespace sd
