// An 8-bit RGB picture, as the pipeline returns it.
#pragma once
#include <cstdint>
#include <utility>
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

struct InitImage;  // sd/settings.h

// The size (width, height) a run that starts from init.path makes when --W and
// --H are not given: the picture's, grown by init.outpaint's margins, rounded
// down to a multiple of `multiple` (the model's). Reads the picture with all of
// its reader's checks; throws sd::Error naming the file.
std::pair<int, int> init_canvas_size(const InitImage& init, int multiple);

}  // namespace sd
