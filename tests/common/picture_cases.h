// The shared inpaint cases' pictures and masks, read as the tool reads them
// (io/image_reader.h), for the tests of the pixel side.
#pragma once
#include <string>
#include <vector>

#include "sd/image.h"

namespace sdtest {

struct PictureCase {
    std::string dir;  // SD_SHARED_CONFORMANCE/inpaint/cases/NAME
    sd::Image picture;
    sd::GreyImage mask;
};

// Every inpaint case that has a mask.png, in name order.
std::vector<PictureCase> inpaint_picture_cases();

}  // namespace sdtest
