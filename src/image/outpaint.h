// Outpainting (--outpaint LEFT,TOP,RIGHT,BOTTOM): the canvas grows by that
// many pixels on each side and the new area is inpainted.
//
// The new area is white in the mask (repainted), the original picture black
// (kept). What the new pixels hold before sampling is A1111's "masked
// content" (modules/processing.py inpainting_fill; scripts/outpainting_mk_2.py,
// poor_mans_outpainting.py):
//  - fill:     the masked area filled with the picture's colours, blurred in
//              from the kept area (fill_masked below; A1111's default);
//  - original: the pixels as they are: black for the new area of an outpaint;
//  - latent noise, latent nothing: not pixel operations. The engine encodes
//    the canvas as for "original" and then replaces the masked part of the
//    init latents by random normal values (latent noise; A1111 draws them from
//    the seed) or by zeros (latent nothing), before the start noise is added.
// Only fill and original are done here.
#pragma once
#include <string>

#include "sd/image.h"

namespace sd {

struct OutpaintMargins {
    int left = 0, top = 0, right = 0, bottom = 0;
};

// "LEFT,TOP,RIGHT,BOTTOM": four whole numbers from 0 to 16384, not all 0.
// Throws sd::Error naming `what` and the text otherwise.
OutpaintMargins parse_outpaint(const std::string& text, const std::string& what);

enum class MaskedContent { Fill, Original, LatentNoise, LatentNothing };
// "fill", "original", "latent-noise" or "latent-nothing".
MaskedContent parse_masked_content(const std::string& text, const std::string& what);
bool is_pixel_fill(MaskedContent content);  // fill and original are done on pixels

struct OutpaintCanvas {
    Image image;     // the picture at (left, top) on a black canvas, or filled (Fill)
    GreyImage mask;  // 255 on the new area, 0 on the picture
};

// The extended canvas and its mask. Throws sd::Error naming `what` when the
// new size would pass max_side on a side.
OutpaintCanvas outpaint_canvas(const Image& img, const OutpaintMargins& m, MaskedContent content,
                               const std::string& what, int max_side = 16384);

// A1111's "fill" (modules/masking.py fill): the picture with alpha 255 - mask,
// blurred at radii 256, 64, 16 (twice), 4 (four times), 2 (twice) and 0, each
// blur (premultiplied by alpha, then divided by the blurred alpha) composited
// "over" the last; the result without alpha. Kept pixels (mask 0) come out as
// they were; masked pixels take the colours of the nearest kept ones, smoothly.
// The blur is a Gaussian of sigma = radius approximated by three box blurs, as
// PIL's GaussianBlur does, but the arithmetic is float, not PIL's 8-bit steps:
// the filled colours are close to A1111's, not equal.
Image fill_masked(const Image& img, const GreyImage& mask);

}  // namespace sd
