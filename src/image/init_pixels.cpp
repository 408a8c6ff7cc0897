#include "image/init_pixels.h"

#include <algorithm>

#include "image/mask.h"
#include "io/image_reader.h"
#include "sd/error.h"
#include "sd/settings.h"

namespace sd {

InitPixels prepare_init_pixels(const Image& picture, const GreyImage* mask, const InitPixelOptions& o) {
    if (mask) check_mask_size(*mask, picture.width, picture.height, o.mask_what);
    Image canvas = picture;
    std::optional<GreyImage> m;
    if (mask) m = *mask;
    if (o.outpaint) {
        OutpaintCanvas c = outpaint_canvas(picture, *o.outpaint, MaskedContent::Original, "--outpaint");
        if (m) {  // the user's mask joins the new area
            for (int y = 0; y < picture.height; ++y)
                for (int x = 0; x < picture.width; ++x) {
                    uint8_t& v =
                        c.mask.v[static_cast<size_t>(y + o.outpaint->top) * c.mask.width + x + o.outpaint->left];
                    v = std::max(v, m->v[static_cast<size_t>(y) * picture.width + x]);
                }
        }
        canvas = std::move(c.image);
        m = std::move(c.mask);
    }
    const int w = o.width > 0 ? o.width : canvas.width, h = o.height > 0 ? o.height : canvas.height;

    InitPixels out;
    out.original = fit_image(canvas, w, h, o.resize_mode);
    out.image = out.original;
    if (m) {
        if (w % o.latent_factor || h % o.latent_factor)
            throw Error("a masked picture must be a multiple of " + std::to_string(o.latent_factor) +
                        " pixels on each side, got " + std::to_string(w) + "x" + std::to_string(h));
        GreyImage soft = fit_grey(*m, w, h, o.resize_mode);
        if (o.invert_mask) soft = invert_mask(soft);
        soft = blur_mask(soft, o.mask_blur);
        if (o.masked_content == MaskedContent::Fill) out.image = fill_masked(out.original, soft);
        out.mask = binarize_mask(soft);
        out.soft_mask = std::move(soft);
    }
    out.image_chw = image_to_chw(out.image);
    if (out.has_mask()) {
        out.masked_image_chw = masked_image_chw(out.image_chw, out.mask);
        out.mask_latent = latent_mask(out.mask, w, h, o.latent_factor);
    }
    return out;
}

std::pair<int, int> init_canvas_size(const InitImage& init, int multiple) {
    const Image picture = read_image(init.path, "--init-img");
    int w = picture.width, h = picture.height;
    if (!init.outpaint.empty()) {
        const OutpaintMargins m = parse_outpaint(init.outpaint, "--outpaint");
        w += m.left + m.right;
        h += m.top + m.bottom;
    }
    const int rw = round_down_to_multiple(w, multiple), rh = round_down_to_multiple(h, multiple);
    if (rw < multiple || rh < multiple)
        throw Error("--init-img " + init.path + " is " + std::to_string(w) + "x" + std::to_string(h) +
                    " pixels; this model needs at least " + std::to_string(multiple) + " on each side");
    return {rw, rh};
}

}  // namespace sd
