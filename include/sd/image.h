// An 8-bit RGB picture, as the pipeline returns it.
#pragma once
#include <cstdint>
#include <vector>

namespace sd {

struct Image {
    int width = 0, height = 0;
    std::vector<uint8_t> rgb;  // height * width * 3, row-major
};

// One 8-bit channel (an inpainting mask: 255 = repaint, 0 = keep).
struct GreyImage {
    int width = 0, height = 0;
    std::vector<uint8_t> v;  // height * width, row-major
};

}  // namespace sd
