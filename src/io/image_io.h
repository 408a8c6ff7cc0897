// PNG output (stb_image_write) and input (io/image_reader.h's decoder, for tests and tools).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sd/image.h"

namespace sd {

std::vector<uint8_t> encode_png(const Image& img);

// Writes the PNG under a temporary name and links it into place, so a killed
// run never leaves a truncated image under a final name. Returns false, and
// writes nothing, when path already exists. A non-empty `parameters` is stored
// as the PNG's iTXt "parameters" text (the generation settings, A1111 style).
bool save_png_new(const std::string& path, const Image& img, const std::string& parameters = "");

// Writes the PNG under a temporary name and renames it into place, replacing
// a file of that name (previews, which are rewritten as a run goes on).
void save_png_replace(const std::string& path, const Image& img);

// The images side by side, `columns` a row, 2 black pixels around each (as
// torchvision's make_grid, which CompVis uses). All images must share a size.
Image make_grid(const std::vector<Image>& images, int columns);

// Throws sd::Error when the file is missing or not a readable PNG.
Image read_png(const std::string& path);

}  // namespace sd
