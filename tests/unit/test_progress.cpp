// Progress text (sd/progress.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "test_util.h"
#include "sd/progress.h"

TEST(Progress, TextHasImagesStepSpeedAndEta) {
    sd::ProgressInfo p;
    p.first_image = 4;
    p.batch_images = 3;
    p.total_images = 21;
    p.step = 12;
    p.steps = 50;
    p.seconds_per_step = 1.234;
    p.eta_seconds = 245;
    EXPECT_EQ(sd::progress_text(p), "images 4-6/21  step 12/50  1.23 s/step  ETA 4m05s");
    p.batch_images = 1;
    p.eta_seconds = 3725;
    EXPECT_EQ(sd::progress_text(p), "image 4/21  step 12/50  1.23 s/step  ETA 1h02m");
}
