#include "image_io.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb_image_write.h>
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_PNG
#include <stb_image.h>

#include "error.h"
#include "fs_util.h"

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

bool save_png_new(const std::string& path, const Image& img) {
    auto png = encode_png(img);
    return write_file_new(path, png.data(), png.size());
}

Image read_png(const std::string& path) {
    int w = 0, h = 0, c = 0;
    unsigned char* data = stbi_load(path.c_str(), &w, &h, &c, 3);
    if (!data) throw Error("cannot read PNG " + path);
    Image img;
    img.width = w;
    img.height = h;
    img.rgb.assign(data, data + static_cast<size_t>(w) * h * 3);
    stbi_image_free(data);
    return img;
}

}  // namespace sd
