#include "io/image_io.h"

#include <algorithm>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb_image_write.h>

#include "io/fs_util.h"
#include "io/image_reader.h"
#include "io/png_text.h"
#include "sd/error.h"

namespace sd {

std::vector<uint8_t> encode_png(const Image& img) {
    std::vector<uint8_t> out;
    auto sink = [](void* ctx, void* data, int size) {
        auto* v = static_cast<std::vector<uint8_t>*>(ctx);
        v->insert(v->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
    };
    if (!stbi_write_png_to_func(sink, &out, img.width, img.height, 3, img.rgb.data(), img.width * 3))
        throw Error("PNG encoding failed");
    return out;
}

bool save_png_new(const std::string& path, const Image& img, const std::string& parameters) {
    auto png = encode_png(img);
    if (!parameters.empty()) png = png_add_itxt(png, "parameters", parameters);
    return write_file_new(path, png.data(), png.size());
}

void save_png_replace(const std::string& path, const Image& img) {
    const auto png = encode_png(img);
    write_file_atomic(path, png.data(), png.size());
}

Image make_grid(const std::vector<Image>& images, int columns) {
    if (images.empty() || columns < 1) throw Error("nothing to put in a grid");
    const int pad = 2, w = images[0].width, h = images[0].height;
    const int cols = std::min<int>(columns, static_cast<int>(images.size()));
    const int rows = (static_cast<int>(images.size()) + cols - 1) / cols;
    Image grid;
    grid.width = cols * (w + pad) + pad;
    grid.height = rows * (h + pad) + pad;
    grid.rgb.assign(static_cast<size_t>(grid.width) * grid.height * 3, 0);
    for (size_t i = 0; i < images.size(); ++i) {
        const Image& img = images[i];
        if (img.width != w || img.height != h) throw Error("grid images differ in size");
        const int x0 = pad + static_cast<int>(i % cols) * (w + pad), y0 = pad + static_cast<int>(i / cols) * (h + pad);
        for (int y = 0; y < h; ++y)
            std::copy_n(&img.rgb[static_cast<size_t>(y) * w * 3], static_cast<size_t>(w) * 3,
                        &grid.rgb[(static_cast<size_t>(y0 + y) * grid.width + x0) * 3]);
    }
    return grid;
}

Image read_png(const std::string& path) {
    const PictureLimits limits;
    const std::string bytes = read_file_capped(path, limits.max_file_bytes, "PNG");
    if (bytes.compare(0, 8, "\x89PNG\r\n\x1a\n", 8) != 0) throw Error("cannot read PNG " + path + ": not a PNG");
    return decode_image(bytes, "PNG " + path, limits);
}

}  // namespace sd
