// The tiny SD 1.x reference cases through the CLI (tests/fixtures/tiny/cases).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "reference_case.h"
#include "test_util.h"

namespace {

std::string case_dir(const std::string& name) { return sdtest::fixtures() + "/tiny/cases/" + name; }

struct Conformance : ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

void check_case(const std::string& name, const std::string& model, const std::vector<std::string>& extra) {
    sdtest::check_cli_case(case_dir(name), sdtest::test_models() + "/" + model, extra);
}

}  // namespace

// Each reference case, through the CLI, for both exports: with the defaults
// ("auto": fused attention, convolutions prepacked) and one head at a time.
// One thread: ctest runs two tests at a time on this two-core machine.
TEST_P(Conformance, MatchesReferenceRun) {
    const auto& [name, model, attention] = GetParam();
    check_case(name, model, {"--attention", attention, "--threads", "1"});
}

// One head at a time is the same arithmetic as all heads at once: the CLI's
// latents are equal to the bit.
TEST(ConformanceAttention, PerHeadIsBitIdenticalToFull) {
    const std::string dir = sdtest::temp_dir();
    std::vector<std::string> latents;
    for (const std::string attention : {"per-head", "full"}) {
        latents.push_back(dir + "/" + attention + ".npy");
        const auto r = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--prompt",
                                    "a red circle", "--steps", "4", "--H", "64", "--W", "96", "--seed", "3", "--threads",
                                    "1", "--quiet", "--attention", attention, "--outdir", dir + "/" + attention,
                                    "--save-latents", latents.back()});
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    const auto a = sdtest::read_text(latents[0]);
    EXPECT_GT(a.size(), 4u * 8 * 12 * 4);
    EXPECT_EQ(a, sdtest::read_text(latents[1]));
}

// --prepack auto is the planner's choice (on when it fits), off and fp16
// weights never pack; with q8 weights it packs the VAE (the UNet expands its
// 8-bit blocks per call). The plan printed is the one the stages are loaded by.
TEST(ConformancePrepack, PlanSaysWhetherConvolutionsArePrepacked) {
    auto plan = [](std::vector<std::string> extra) {
        std::vector<std::string> args{sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--prompt", "x",
                                      "--plan"};
        args.insert(args.end(), extra.begin(), extra.end());
        const auto r = sdtest::run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return (r.out + r.err).find("convolutions prepacked") != std::string::npos;
    };
    EXPECT_TRUE(plan({}));
    EXPECT_TRUE(plan({"--prepack", "on"}));
    EXPECT_FALSE(plan({"--prepack", "off"}));
    EXPECT_FALSE(plan({"--weights", "fp16"}));
    EXPECT_TRUE(plan({"--weights", "q8"}));
    EXPECT_FALSE(plan({"--weights", "q8", "--prepack", "off"}));
}

// Two threads change the summation order; the fixtures' tolerance covers it.
TEST(ConformanceThreads, TwoThreadsAndChunkedAttention) {
    check_case("p4_plms10_batch2_64x64", "tiny-st", {"--attention", "chunked:7", "--threads", "2"});
}

INSTANTIATE_TEST_SUITE_P(
    TinyCases, Conformance,
    ::testing::Combine(::testing::Values("p1_plms50_64x64", "p2_plms10_64x96", "p3_ddim10_64x64", "p4_plms10_batch2_64x64"),
                       ::testing::Values("tiny-st", "tiny-ckpt"), ::testing::Values("auto", "per-head")),
    [](const auto& info) {
        std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
        for (auto& ch : s)
            if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
        return s;
    });
