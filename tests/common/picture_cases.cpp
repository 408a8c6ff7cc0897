#include "picture_cases.h"

#include "io/image_reader.h"
#include "test_util.h"

namespace sdtest {

std::vector<PictureCase> inpaint_picture_cases() {
    std::vector<PictureCase> cases;
    for (const auto& dir : shared_cases_with("inpaint", "mask.png"))
        cases.push_back({dir, sd::read_image(dir + "/init.png", "--init-img"), sd::read_mask(dir + "/mask.png", "--mask")});
    return cases;
}

}  // namespace sdtest
