// The web UI's NV generator (core/philox.h) against the a1111-rng fixtures
// (the web UI's rng.py and rng_philox.py run on given seeds), and the noise
// options' rules (sd/noise_rules.h).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/philox.h"
#include "io/npy.h"
#include "sd/error.h"
#include "sd/noise_rules.h"
#include "test_util.h"

namespace {

const std::string kRng = std::string(SD_SHARED_CONFORMANCE) + "/a1111-rng";

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(sdtest::read_text(path)); }

float max_diff(const float* a, const float* b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace

// rng_philox.py's own documentation: Generator(0).randn((3, 4)) and what CUDA gives for seed 0.
TEST(Philox, SeedZeroAsTheReferenceDocuments) {
    sd::PhiloxGenerator g(0);
    const std::vector<float> v = g.randn(12);
    const double expected[12] = {-0.92466259, -0.42534415, -2.6438457,  0.14518388, -0.12086647, -0.57972564,
                                 -0.62285122, -0.32838709, -1.07454231, -0.36314407, -1.67105067, 2.26550497};
    for (int i = 0; i < 12; ++i) EXPECT_NEAR(v[i], expected[i], 3e-7) << i;
    EXPECT_EQ(g.offset(), 1u);
}

// Value j of a call depends on (seed, offset, j) alone: a shorter call is a prefix
// of a longer one, and the next call differs.
TEST(Philox, CallsAreCountersNotStreams) {
    sd::PhiloxGenerator a(123), b(123);
    const auto long_call = a.randn(100), short_call = b.randn(7);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(long_call[i], short_call[i]);
    const auto second = b.randn(7);
    EXPECT_NE(second, short_call);
    // The seed's high word is the key's second word.
    EXPECT_NE(sd::PhiloxGenerator(3).randn(8), sd::PhiloxGenerator((1ULL << 32) + 3).randn(8));
}

// Every NV case whose noise is the generators' draws as they are (no variation
// seed, no resize): each image's start noise from its seed, then the later
// draws from the same generator, or with ENSD from one seeded seed + ENSD.
TEST(Philox, EveryPlainNvCaseOfTheFixtures) {
    int checked = 0;
    for (const auto& name : read_json(kRng + "/index.json")) {
        const std::string dir = kRng + "/" + name.get<std::string>();
        const auto args = read_json(dir + "/args.json");
        if (args["source"] != "NV" || !args["subseeds"].is_null() || args["seed_resize_from_w"].get<int>() > 0)
            continue;
        const sd::NpyArray first = sd::read_npy(dir + "/noise_first.npy");
        const sd::NpyArray next = sd::read_npy(dir + "/noise_next.npy");
        const auto seeds = args["seeds"].get<std::vector<uint64_t>>();
        const int64_t ensd = args["eta_noise_seed_delta"].get<int64_t>();
        const size_t per_image = static_cast<size_t>(first.numel()) / seeds.size();
        ASSERT_EQ(next.shape[1], static_cast<int64_t>(seeds.size())) << dir;
        for (size_t i = 0; i < seeds.size(); ++i) {
            sd::PhiloxGenerator g(seeds[i]);
            const auto start = g.randn(per_image);
            EXPECT_LE(max_diff(start.data(), first.as<float>() + i * per_image, per_image), 1e-6f)
                << dir << " image " << i;
            if (ensd != 0) g = sd::PhiloxGenerator(seeds[i] + static_cast<uint64_t>(ensd));
            for (int64_t k = 0; k < next.shape[0]; ++k) {
                const auto draw = g.randn(per_image);
                const float* want = next.as<float>() + (static_cast<size_t>(k) * seeds.size() + i) * per_image;
                EXPECT_LE(max_diff(draw.data(), want, per_image), 1e-6f) << dir << " image " << i << " draw " << k;
            }
        }
        ++checked;
    }
    EXPECT_GE(checked, 4);  // seed 42 at 512, a batch of 2, ENSD, a seed over 2^32
}

TEST(NoiseRules, RefusesWhatCannotBeUsed) {
    sd::NoiseSettings s;
    EXPECT_NO_THROW(sd::check_noise_settings(s));
    s.subseed_strength = 1.5;
    s.subseed = 5;
    EXPECT_NE(sdtest::error_of([&] { sd::check_noise_settings(s); }).find("--subseed-strength must be from 0 to 1"),
              std::string::npos);
    s.subseed_strength = std::nan("");
    EXPECT_NE(sdtest::error_of([&] { sd::check_noise_settings(s); }), "");
    s.subseed_strength = 0.5;
    EXPECT_NO_THROW(sd::check_noise_settings(s));
    s.subseed.reset();
    EXPECT_NE(sdtest::error_of([&] { sd::check_noise_settings(s); }).find("needs --subseed"), std::string::npos);
    s = {};
    s.rng = "gpu";
    EXPECT_NE(sdtest::error_of([&] { sd::check_noise_settings(s); }).find("--rng must be cpu or nv"),
              std::string::npos);
    s = {};
    s.seed_resize_from_w = 64;
    EXPECT_NE(sdtest::error_of([&] { sd::check_noise_settings(s); }), "");
}

TEST(NoiseRules, ParsesTheFlags) {
    EXPECT_EQ(sd::parse_rng("NV"), "nv");
    EXPECT_EQ(sd::parse_rng("cpu"), "cpu");
    EXPECT_NE(sdtest::error_of([] { sd::parse_rng("cuda"); }), "");
    sd::NoiseSettings s;
    sd::parse_seed_resize_from("128x96", s);
    EXPECT_EQ(s.seed_resize_from_w, 128);
    EXPECT_EQ(s.seed_resize_from_h, 96);
    for (const char* bad : {"128", "128x", "x96", "4x96", "128x96x2", "-8x8", "a x b"})
        EXPECT_NE(sdtest::error_of([&] { sd::parse_seed_resize_from(bad, s); }).find("--seed-resize-from"),
                  std::string::npos)
            << bad;
}
