// PNG output (stb_image_write) and input (stb_image, for tests and tools).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sd {

struct Image {
    int width = 0, height = 0;
    std::vector<uint8_t> rgb;  // height * width * 3, row-major
};

std::vector<uint8_t> encode_png(const Image& img);

// Writes the PNG under a temporary name and links it into place, so a killed
// run never leaves a truncated image under a final name. Returns false, and
// writes nothing, when path already exists.
bool save_png_new(const std::string& path, const Image& img);

// Throws sd::Error when the file is missing or not a readable PNG.
Image read_png(const std::string& path);

}  // namespace sd
