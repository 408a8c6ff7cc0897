// The memory options end to end: every attention strategy, sequential loading
// and micro-batching must still reproduce the reference runs; VAE tiling must
// not leave seams. (The planner's arithmetic: unit/test_planner.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include <torch/cuda.h>

#include "engine/block_cache.h"
#include "engine/operators.h"
#include "engine/stage_loader.h"
#include "conformance_util.h"
#include "sd/error.h"
#include "io/image_io.h"
#include "test_util.h"

using sdtest::run;

namespace {

std::string tiny_model() { return sdtest::test_models() + "/tiny-st"; }
std::string case_dir(const std::string& name) { return sdtest::fixtures() + "/tiny/cases/" + name; }

}  // namespace

// The allocator behind LibTorch's large CPU blocks: a freed block comes back
// for the next request of its size, nothing beyond the limit is kept, and
// oneDNN's raw allocations (convolutions) go through it unharmed.
TEST(BlockCache, ReusesFreedBlocksUpToTheLimit) {
    sd::install_block_cache();
    sd::set_block_cache_limit(8 << 20);
    const auto start = sd::block_cache_stats();
    void* first = nullptr;
    {
        auto t = at::empty({1 << 20});  // 4 MiB
        first = t.data_ptr();
    }
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, start.cached_bytes + (4u << 20));
    {
        auto t = at::empty({1 << 20});
        EXPECT_EQ(t.data_ptr(), first);
        EXPECT_EQ(sd::block_cache_stats().hits, start.hits + 1);
    }
    { auto big = at::empty({4 << 20}); }  // 16 MiB: over the limit, back to the OS
    EXPECT_LE(sd::block_cache_stats().cached_bytes, 8u << 20);
    const auto x = at::randn({1, 32, 64, 64}), w = at::randn({64, 32, 3, 3});
    const auto y1 = at::conv2d(x, w, {}, 1, 1), y2 = at::conv2d(x, w, {}, 1, 1);
    EXPECT_TRUE(at::equal(y1, y2));
    EXPECT_GE(sd::block_cache_stats().peak_cached_bytes, 4u << 20);
    sd::drop_cached_blocks();  // between stages: everything back, the limit stays
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, 0u);
    EXPECT_EQ(sd::block_cache_stats().peak_cached_bytes, 0u);
    { auto t = at::empty({1 << 20}); }
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, 4u << 20);
    sd::set_block_cache_limit(0);
    EXPECT_EQ(sd::block_cache_stats().cached_bytes, 0u);
}

// ---- end to end on the tiny model ----

struct MemoryConformance : ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(MemoryConformance, MatchesReferenceRun) {
    const auto& [name, attention, sequential] = GetParam();
    sdtest::check_cli_case(case_dir(name), tiny_model(),
                           {"--attention", attention, "--sequential-load", sequential, "--threads", "1"});
}

INSTANTIATE_TEST_SUITE_P(
    TinyCases, MemoryConformance,
    ::testing::Combine(::testing::Values("p1_plms50_64x64", "p2_plms10_64x96", "p3_ddim10_64x64", "p4_plms10_batch2_64x64"),
                       ::testing::Values("full", "per-head", "chunked:16", "auto"), ::testing::Values("on", "off")),
    [](const auto& info) {
        std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_seq_" + std::get<2>(info.param);
        for (auto& ch : s)
            if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
        return s;
    });

// The fixture's weights are fp16-representable, so an fp16 export must give
// the reference run both when widened at load and when each layer widens its
// weights as it runs (--weights fp16).
struct HalfWeightFile : ::testing::TestWithParam<std::string> {};

TEST_P(HalfWeightFile, MatchesReferenceRun) {
    sdtest::check_cli_case(case_dir("p4_plms10_batch2_64x64"), sdtest::test_models() + "/tiny-f16",
                           {"--weights", GetParam(), "--threads", "1"});
}

INSTANTIATE_TEST_SUITE_P(TinyCases, HalfWeightFile, ::testing::Values("fp32", "fp16"));

TEST(HalfWeights, Fp32FileHeldInFp16MatchesReferenceRun) {
    sdtest::check_cli_case(case_dir("p3_ddim10_64x64"), tiny_model(), {"--weights", "fp16", "--threads", "1"});
}

// The plan the run follows holds the UNet in half (the saving itself is
// measured on the full-size model, docs/benchmarks.md).
TEST(HalfWeights, PlanHoldsTheUnetInHalf) {
    auto unet_weights = [&](const std::string& weights) {
        auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan",
                      "--weights", weights});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        for (const auto& line : sdtest::lines(r.out))
            if (line.find("unet") != std::string::npos) return line.substr(line.find("weights"), line.find(',') - line.find("weights"));
        return std::string("no unet line in ") + r.out;
    };
    const std::string full = unet_weights("fp32"), half = unet_weights("fp16");
    EXPECT_NE(full, half);
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan", "--weights", "fp16"});
    EXPECT_NE(r.out.find("weights held in fp16"), std::string::npos) << r.out;
}

TEST(HalfWeights, UnknownWeightTypeIsRefused) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--weights", "int8", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("--weights"), std::string::npos) << r.err;
}

TEST(MicroBatch, OneImagePerPassMatchesTheBatchOfTwo) {
    sdtest::check_cli_case(case_dir("p4_plms10_batch2_64x64"), tiny_model(), {"--batch-size", "1", "--threads", "1"});
}

TEST(PlanFlag, PrintsEveryStageAndExits) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* s : {"text encoder", "unet", "vae decoder", "predicted peak"})
        EXPECT_NE(r.out.find(s), std::string::npos) << r.out;
}

TEST(PlanFlag, TooSmallBudgetIsRefusedWithTheBudgetThatWouldWork) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--max-memory", "20M",
                  "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("not enough memory"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--max-memory"), std::string::npos) << r.err;
}

TEST(VerboseSummary, PredictedAndMeasuredPeaksAndLoadTimes) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--steps", "2",
                  "--sampler", "ddim", "--quiet", "--verbose", "--outdir", sdtest::temp_dir()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* stage : {"text encoder peak: predicted", "unet         peak: predicted", "vae decoder  peak: predicted"})
        EXPECT_NE(r.err.find(stage), std::string::npos) << r.err;
    double text = -1, unet = -1, vae = -1, encode = -1, first = -1, decode = -1;
    const auto pos = r.err.find("timing: ");
    ASSERT_NE(pos, std::string::npos) << r.err;
    ASSERT_EQ(std::sscanf(r.err.c_str() + pos,
                          "timing: text encoder load %lf s, UNet load %lf s, VAE load %lf s, first prompts encoded in "
                          "%lf s, start to first step %lf s, last decode %lf s",
                          &text, &unet, &vae, &encode, &first, &decode), 6)
        << r.err;
    // Both loads and the encoding happen before the first step, and the process start before them.
    EXPECT_GT(first, 0);
    EXPECT_GE(encode, 0);
    EXPECT_GE(first + 0.03, text + unet + encode) << r.err;  // /proc's clock ticks are 10 ms
    EXPECT_GE(vae, 0);
    EXPECT_GT(decode, 0);  // the decode itself, its loading not counted
}

TEST(Precision, HalfComputeIsRefusedOnCpuWithTheReason) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--precision", "fp16", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("CPU"), std::string::npos) << r.err;
    r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--precision", "fp8", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("unknown --precision 'fp8'"), std::string::npos) << r.err;
}

// bf16 compute on a CPU: weights held in bf16, convolutions, Linear layers
// and attention through oneDNN's bf16 paths, scores, softmax and norms in
// fp32. Its latents must differ from fp32's (the compute really was bf16) yet
// stay near the reference: measured 2.8% relative RMS on this random-weight
// model (docs/benchmarks.md "bf16 fidelity"). A CPU without bf16 instructions
// refuses it (the next test), and this one is skipped there.
TEST(Precision, BfloatComputeRunsOnCpuNearTheReference) {
    const std::string dir = case_dir("p3_ddim10_64x64");
    auto args = sdtest::read_json(dir + "/args.json");
    const std::string out = sdtest::temp_dir();
    auto cmd = sdtest::case_cli_args(args, tiny_model(), out);  // the CLI and the case's flags
    for (const char* a : {"--precision", "bf16", "--threads", "1", "--json", "--save-latents"}) cmd.push_back(a);
    cmd.push_back(out + "/latents.npy");
    auto r = run(cmd);
    if (r.exit_code == 1 && r.err.find("bf16 instructions") != std::string::npos)
        GTEST_SKIP() << "this CPU has no bf16 instructions: " << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
    // The PNG text says so: the picture differs from an fp32 run's.
    const auto image = nlohmann::json::parse(sdtest::lines(r.out).at(0));
    EXPECT_NE(image.at("parameters").get<std::string>().find(", Precision: bf16"), std::string::npos) << r.out;
    const auto ref = sdtest::load_tensor(dir + "/latents.npy");
    const auto got = sdtest::load_tensor(out + "/latents.npy");
    ASSERT_EQ(ref.sizes(), got.sizes());
    const double rel = ((got - ref).norm() / ref.norm()).item<double>();
    EXPECT_GT(sdtest::max_abs_diff(got, ref), 1e-3) << "identical to fp32: bf16 was not used";
    EXPECT_LT(rel, 0.05);
    std::cout << "bf16 latents vs the fp32 reference: relative RMS " << rel << std::endl;
}

// Without bf16 instructions bf16 is emulated, 18-50x slower than fp32: refused
// in one line. oneDNN's DNNL_MAX_CPU_ISA=AVX2 stands in for such a CPU.
TEST(Precision, BfloatIsRefusedWithoutBf16Instructions) {
    auto r = run({"/usr/bin/env", "DNNL_MAX_CPU_ISA=AVX2", sdtest::cli(), "--model", tiny_model(), "--prompt", "x",
                  "--precision", "bf16", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("bf16 instructions"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--precision fp32"), std::string::npos) << r.err;
}

namespace {

// Whether the CLI sees AMX: the CPU has it and DNNL_MAX_CPU_ISA, which the CLI heeds, does not hide it.
bool cpu_shows_amx() {
    const char* isa = std::getenv("DNNL_MAX_CPU_ISA");
    if (isa && *isa && std::string(isa).find("AMX") == std::string::npos && std::string(isa) != "ALL") return false;
    return sdtest::read_text("/proc/cpuinfo").find(" amx_bf16") != std::string::npos;
}

bool cpu_is_amd() { return sdtest::read_text("/proc/cpuinfo").find("AuthenticAMD") != std::string::npos; }

}  // namespace

// Without AMX, on an Intel Xeon, bf16 runs slower than fp32 (docs/benchmarks.md): bf16 still runs, for
// its memory, with one note saying so. DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 stands in for such a CPU. On
// AMD's Zen 4, whose bf16 dot product outruns fp32, there is no note.
TEST(Precision, BfloatWithoutAmxRunsWithANote) {
    const std::vector<std::string> args = {sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W",
                                           "64", "--steps", "1", "--precision", "bf16", "--outdir", sdtest::temp_dir()};
    std::vector<std::string> no_amx = {"/usr/bin/env", "DNNL_MAX_CPU_ISA=AVX512_CORE_BF16"};
    no_amx.insert(no_amx.end(), args.begin(), args.end());
    auto r = run(no_amx);
    if (r.exit_code == 1 && r.err.find("bf16 instructions") != std::string::npos)
        GTEST_SKIP() << "this CPU has no bf16 instructions: " << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const bool note = r.err.find("note: --precision bf16 on a CPU without AMX can run slower than fp32") !=
                      std::string::npos;
    EXPECT_EQ(note, !cpu_is_amd()) << r.err;
    if (!cpu_shows_amx()) return;
    r = run(args);  // this CPU has AMX: no note
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("without AMX"), std::string::npos) << r.err;
}

// ---- a bf16 export (scripts/export_model.py --dtype bfloat16): tiny-bf16 ----

namespace {

std::string tiny_bf16() { return sdtest::test_models() + "/tiny-bf16"; }

// One 64x64 picture of the tiny model; its PNG's bytes, or the run's stderr after "FAILED".
std::string picture(const std::string& model, const std::vector<std::string>& extra) {
    const std::string out = sdtest::temp_dir();
    std::vector<std::string> cmd = {sdtest::cli(), "--model", model, "--prompt", "a red cube", "--seed", "3", "--H",
                                    "64", "--W", "64", "--steps", "4", "--threads", "1", "--outdir", out};
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    auto r = run(cmd);
    if (r.exit_code != 0) return "FAILED " + r.err;
    return sdtest::read_text(out + "/00000.png");
}

bool has_bf16_compute() {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan",
                  "--precision", "bf16"});
    return r.exit_code == 0;
}

}  // namespace

// --precision bf16 maps a bf16 file as it is, and narrows an fp32 one at load; both round to
// nearest even, so the pictures are the same bytes (the text encoder too runs in bf16 in both).
TEST(BfloatFile, MappedAsItIsGivesTheNarrowedFilesPicture) {
    if (!has_bf16_compute()) GTEST_SKIP() << "this CPU has no bf16 instructions";
    const std::string mapped = picture(tiny_bf16(), {"--precision", "bf16"});
    const std::string narrowed = picture(tiny_model(), {"--precision", "bf16"});
    ASSERT_EQ(mapped.rfind("FAILED", 0), std::string::npos) << mapped;
    EXPECT_TRUE(mapped == narrowed) << "the bf16 file's picture differs from the fp32 file's under --precision bf16";
    EXPECT_NE(mapped, picture(tiny_model(), {})) << "identical to fp32's: bf16 was not used";
}

// The other precisions widen a bf16 file at load and run the fp32 route: auto is fp32 on a CPU.
TEST(BfloatFile, WidenedForFp32AndAuto) {
    const std::string fp32 = picture(tiny_bf16(), {"--precision", "fp32"});
    ASSERT_EQ(fp32.rfind("FAILED", 0), std::string::npos) << fp32;
    EXPECT_TRUE(fp32 == picture(tiny_bf16(), {})) << "--precision auto differs from fp32 on a bf16 file";
    const std::string half = picture(tiny_bf16(), {"--weights", "fp16"});
    EXPECT_EQ(half.rfind("FAILED", 0), std::string::npos) << half;
    auto r = run({sdtest::cli(), "--model", tiny_bf16(), "--prompt", "x", "--H", "64", "--W", "64", "--plan"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("weights held in fp32 (text encoder: fp32)"), std::string::npos) << r.out;
    // Where bf16 is the faster route (AMX), one note says so; an fp32 export gets none.
    r = run({sdtest::cli(), "--model", tiny_bf16(), "--prompt", "x", "--H", "64", "--W", "64", "--steps", "1",
             "--outdir", sdtest::temp_dir()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (cpu_shows_amx()) EXPECT_NE(r.err.find("note: the model holds bf16 weights"), std::string::npos) << r.err;
    r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--steps", "1",
             "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.err.find("bf16 weights"), std::string::npos) << r.err;
}

// bf16's 3x3 convolutions of 64 channels or more at 16x16 pixels or more run by Winograd
// on a CPU without AMX (sd::conv3x3, src/kernels/winograd_bf16.h): the tiny model's second
// level at 256x256. Its
// weights are then left plain at load (prepack_convolutions), or the route could not run.
// Its latents differ from --winograd off's by bf16 rounding alone: as near fp32's as theirs.
TEST(BfloatFile, WinogradRunsWhereItPaysAndOffKeepsTheDirectConvolutions) {
    if (!has_bf16_compute()) GTEST_SKIP() << "this CPU has no bf16 instructions";
    auto latents = [](const std::string& size, const std::vector<std::string>& extra) {
        const std::string out = sdtest::temp_dir();
        std::vector<std::string> cmd = {sdtest::cli(), "--model", tiny_bf16(), "--prompt", "a red cube", "--seed", "3",
                                        "--H", size, "--W", size, "--steps", "4", "--sampler", "ddim", "--threads",
                                        "1", "--quiet", "--outdir", out, "--save-latents", out + "/latents.npy"};
        cmd.insert(cmd.end(), extra.begin(), extra.end());
        auto r = run(cmd);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.exit_code == 0 ? sdtest::load_tensor(out + "/latents.npy") : at::Tensor();
    };
    const auto on = latents("256", {"--precision", "bf16"});
    const auto off = latents("256", {"--precision", "bf16", "--winograd", "off"});
    const auto fp32 = latents("256", {"--precision", "fp32"});
    ASSERT_TRUE(on.defined() && off.defined() && fp32.defined());
    auto rel = [](const at::Tensor& a, const at::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); };
    if (cpu_shows_amx())  // AMX keeps oneDNN's direct convolutions (kernels/winograd_bf16.h)
        EXPECT_TRUE(at::equal(on, off));
    else
        EXPECT_GT(rel(on, off), 1e-4) << "the same latents: the Winograd route did not run";
    EXPECT_LT(rel(on, fp32), 1.5 * rel(off, fp32) + 0.01) << "on " << rel(on, fp32) << ", off " << rel(off, fp32);
    // At 64x64 no layer is large enough: the same convolutions, the same latents.
    const auto small_on = latents("64", {"--precision", "bf16"});
    const auto small_off = latents("64", {"--precision", "bf16", "--winograd", "off"});
    ASSERT_TRUE(small_on.defined() && small_off.defined());
    EXPECT_TRUE(at::equal(small_on, small_off));
}

// The VAE's bf16 3x3 layers take the same route at the sizes they run at (latent x latent_mul):
// the tiny VAE's 64-channel levels at a 32x32 latent, in the decoder and the encoder. Their
// weights stay plain for it, and the result stays as near fp32's as the direct bf16
// convolutions keep it.
TEST(BfloatFile, VaeTakesTheWinogradRouteWhereItRuns) {
    if (!has_bf16_compute()) GTEST_SKIP() << "this CPU has no bf16 instructions";
    c10::InferenceMode guard;
    sd::set_bf16_winograd(true);
    at::manual_seed(5);
    const std::pair<std::string, at::Tensor> stages[] = {{"vae_decoder", at::randn({1, 4, 32, 32})},
                                                         {"vae_encoder", at::rand({1, 3, 256, 256}) * 2 - 1}};
    for (const auto& [name, input] : stages) {
        SCOPED_TRACE(name);
        const std::string path = tiny_bf16() + "/" + name + ".pt";
        auto fp32 = sd::load_stage(path, at::kFloat);  // the same bf16 values, widened
        auto routed = sd::load_stage(path, at::kBFloat16), direct = sd::load_stage(path, at::kBFloat16);
        const int packed_routed = sd::prepack_convolutions(routed, 32, 32);
        const int packed_direct = sd::prepack_convolutions(direct, 0, 0);  // no size: every layer prepacked
        const auto want = fp32.forward({input}).toTensor();
        const auto on = routed.forward({input.to(at::kBFloat16)}).toTensor().to(at::kFloat);
        const auto off = direct.forward({input.to(at::kBFloat16)}).toTensor().to(at::kFloat);
        ASSERT_EQ(on.sizes(), want.sizes());
        auto rel = [](const at::Tensor& a, const at::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); };
        if (cpu_shows_amx()) {  // AMX keeps oneDNN's direct convolutions (kernels/winograd_bf16.h)
            EXPECT_EQ(packed_routed, packed_direct);
            EXPECT_TRUE(at::equal(on, off));
        } else {
            // the 64-channel levels' ResnetBlocks (two 3x3 layers each), mid's two blocks
            EXPECT_GE(packed_direct - packed_routed, 8) << packed_routed << " of " << packed_direct << " prepacked";
            EXPECT_GT(rel(on, off), 1e-4) << "the same result: the Winograd route did not run";
        }
        EXPECT_LT(rel(on, want), 1.5 * rel(off, want) + 0.005) << "on " << rel(on, want) << ", off " << rel(off, want);
    }
}

// The plan and --verbose say how the text encoder is held: bf16 in a bf16 run, and at half its fp32 bytes.
TEST(BfloatFile, BfloatRunHoldsTheTextEncoderInBf16) {
    if (!has_bf16_compute()) GTEST_SKIP() << "this CPU has no bf16 instructions";
    auto text_weights = [](const std::string& out) {
        for (const auto& line : sdtest::lines(out))
            if (line.find("text encoder:") != std::string::npos && line.find("weights") != std::string::npos)
                return line.substr(line.find("weights"), line.find(',') - line.find("weights"));
        return std::string("no text encoder line");
    };
    auto fp32 = run({sdtest::cli(), "--model", tiny_bf16(), "--prompt", "x", "--H", "64", "--W", "64", "--plan"});
    auto bf16 = run({sdtest::cli(), "--model", tiny_bf16(), "--prompt", "x", "--H", "64", "--W", "64", "--plan",
                     "--precision", "bf16"});
    ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
    EXPECT_NE(bf16.out.find("weights held in bf16 (text encoder: bf16)"), std::string::npos) << bf16.out;
    EXPECT_NE(text_weights(fp32.out), text_weights(bf16.out)) << fp32.out << bf16.out;
}

// model.json's dtype names one of the known storage types; another gets one line naming the file.
TEST(BfloatFile, UnknownDtypeInModelJsonIsOneLine) {
    const std::string dir = sdtest::temp_dir() + "/model";
    std::filesystem::copy(tiny_bf16(), dir);
    std::string json = sdtest::read_text(dir + "/model.json");
    const std::string from = "\"dtype\": \"bfloat16\"";
    ASSERT_NE(json.find(from), std::string::npos) << json.substr(0, 400);
    json.replace(json.find(from), from.size(), "\"dtype\": \"bfloat8\"");
    sdtest::write_text(dir + "/model.json", json);
    auto r = run({sdtest::cli(), "--model", dir, "--prompt", "x", "--H", "64", "--W", "64", "--outdir",
                  sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("model.json"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("bfloat8"), std::string::npos) << r.err;
}

TEST(Device, UnknownOrMissingDevicesAreRefusedInOneLine) {
    auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--device", "tpu", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("unknown --device 'tpu'"), std::string::npos) << r.err;
    if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA GPU is visible";
    r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--device", "cuda", "--outdir", sdtest::temp_dir()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("no CUDA GPU"), std::string::npos) << r.err;
    // auto falls back to the CPU, in fp32.
    r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "x", "--H", "64", "--W", "64", "--plan"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("compute: fp32 on cpu, weights held in fp32"), std::string::npos) << r.out;
}

// Tiled decoding of a 256x256 image in 16-latent-pixel tiles: close to the
// whole-image decode, and no step at the tile borders larger than the image's
// own texture.
TEST(VaeTiling, TilesBlendWithoutSeams) {
    auto gen = [&](const std::string& tiling) {
        const std::string out = sdtest::temp_dir();
        auto r = run({sdtest::cli(), "--model", tiny_model(), "--prompt", "a house", "--H", "256", "--W", "256", "--steps", "4",
                      "--threads", "1", "--quiet", "--vae-tiling", tiling, "--outdir", out});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return sd::read_png(sdtest::lines(r.out).at(0));
    };
    auto whole = gen("off"), tiled = gen("16");
    ASSERT_EQ(whole.rgb.size(), tiled.rgb.size());
    double sum = 0;
    for (size_t i = 0; i < whole.rgb.size(); ++i) sum += std::abs(int(whole.rgb[i]) - int(tiled.rgb[i]));
    const double mean_diff = sum / static_cast<double>(whole.rgb.size());
    EXPECT_LT(mean_diff, 8.0) << "tiled decode strays from the whole-image decode";
    // Horizontal steps between neighbouring columns: at the tiles' overlap
    // centres versus everywhere, relative to the same columns of the whole decode.
    auto column_step = [](const sd::Image& im, int x) {
        double s = 0;
        for (int y = 0; y < im.height; ++y)
            for (int c = 0; c < 3; ++c)
                s += std::abs(int(im.rgb[(y * im.width + x + 1) * 3 + c]) - int(im.rgb[(y * im.width + x) * 3 + c]));
        return s;
    };
    double worst_ratio = 0;
    for (int x = 0; x + 1 < tiled.width; ++x)
        worst_ratio = std::max(worst_ratio, column_step(tiled, x) / std::max(1.0, column_step(whole, x)));
    EXPECT_LT(worst_ratio, 1.5) << "a column step in the tiled image is much larger than in the whole decode";
}
