// Each stage of the exported tiny model against the reference fixtures
// (tests/fixtures/README.md gives the files and the pass criteria).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <torch/script.h>

#include "conformance_util.h"
#include "engine/blocked_operators.h"
#include "engine/q8_weights.h"
#include "engine/stage_loader.h"
#include "io/npy.h"
#include "engine/sampling_loop.h"
#include "core/schedule.h"
#include "test_util.h"

namespace {

const std::vector<std::string> kCases = {"p1_plms50_64x64", "p2_plms10_64x96", "p3_ddim10_64x64", "p4_plms10_batch2_64x64"};

at::Tensor load(const std::string& case_name, const std::string& file) {
    auto a = sd::read_npy(sdtest::fixtures() + "/tiny/cases/" + case_name + "/" + file);
    auto dtype = a.dtype == "<f4" ? at::kFloat : a.dtype == "<i8" ? at::kLong : at::kByte;
    return at::from_blob(a.data.data(), a.shape, dtype).clone();
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
    EXPECT_EQ(a.sizes(), b.sizes());
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

torch::jit::Module stage(const std::string& name) { return sd::load_stage(sdtest::test_models() + "/tiny-st/" + name); }

const std::vector<std::string> kAttention = {"fused", "full", "per-head", "chunked:16", "chunked:5"};

}  // namespace

TEST(Stages, StartNoiseMatchesReferenceGenerator) {
    for (const auto& c : kCases) {
        auto ref = load(c, "start_noise.npy");
        const int64_t seed = c == kCases[0] ? 42 : c == kCases[1] ? 1234 : c == kCases[2] ? 7 : 2024;
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
        auto x = at::randn(ref.sizes(), gen);
        EXPECT_TRUE(at::equal(x, ref)) << c;
    }
}

TEST(Stages, TextEncoderMatchesCondAndUncond) {
    c10::InferenceMode guard;
    auto te = stage("text_encoder.pt");
    for (const auto& c : kCases) {
        auto cond = te.forward({load(c, "tokens.npy")}).toTensor();
        auto uncond = te.forward({load(c, "uncond_tokens.npy")}).toTensor();
        EXPECT_LE(max_abs_diff(cond, load(c, "cond.npy")), 1e-4) << c;
        EXPECT_LE(max_abs_diff(uncond, load(c, "uncond.npy")), 1e-4) << c;
    }
}

TEST(Stages, UnetMatchesEveryCallInEveryAttentionMode) {
    c10::InferenceMode guard;
    auto unet = stage("unet.pt");
    for (const auto& attention : kAttention) {
        sd::set_attention(unet, sd::parse_attention(attention));
        for (const auto& c : kCases) {
            auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
            auto ctx = load(c, "unet_context.npy");
            const int64_t K = xs.size(0);
            for (int64_t k : {int64_t(0), K / 2, K - 1}) {
                auto out = unet.forward({xs[k], ts[k], ctx}).toTensor();
                EXPECT_LE(max_abs_diff(out, outs[k]), 2e-4) << c << " call " << k << " attention " << attention;
            }
        }
    }
}

TEST(Stages, VaeDecoderMatchesDecodedInEveryAttentionMode) {
    c10::InferenceMode guard;
    auto vae = stage("vae_decoder.pt");
    for (const auto& attention : kAttention) {
        sd::set_attention(vae, sd::parse_attention(attention));
        for (const auto& c : kCases) {
            auto decoded = vae.forward({load(c, "latents.npy") * (1.0 / 0.18215)}).toTensor();
            EXPECT_LE(max_abs_diff(decoded, load(c, "decoded.npy")), 1e-3) << c << " attention " << attention;
            // uint8 by truncation, as txt2img
            auto img = (255.0 * at::clamp((decoded + 1.0) / 2.0, 0.0, 1.0)).to(at::kByte).permute({0, 2, 3, 1});
            auto diff = (img.to(at::kInt) - load(c, "image.npy").to(at::kInt)).abs();
            EXPECT_LE(diff.max().item<int>(), 1) << c;
            EXPECT_LE(diff.gt(0).sum().item<int64_t>(), diff.numel() / 1000) << c;
        }
    }
}

// Convolution weights in oneDNN's layout (the CLI's default on a CPU in fp32)
// with the fused attention: the same tolerances as the dense stages.
TEST(Stages, PrepackedConvolutionsMatchTheReference) {
    c10::InferenceMode guard;
    auto unet = stage("unet.pt"), vae = stage("vae_decoder.pt");
    EXPECT_GT(sd::prepack_convolutions(unet), 10);
    EXPECT_GT(sd::prepack_convolutions(vae), 10);
    EXPECT_EQ(sd::prepack_convolutions(unet), 0) << "a second call finds nothing left to pack";
    sd::set_attention(unet, sd::parse_attention("fused"));
    sd::set_attention(vae, sd::parse_attention("fused"));
    for (const auto& c : kCases) {
        auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
        auto ctx = load(c, "unet_context.npy");
        for (int64_t k : {int64_t(0), xs.size(0) - 1})
            EXPECT_LE(max_abs_diff(unet.forward({xs[k], ts[k], ctx}).toTensor(), outs[k]), 2e-4) << c << " call " << k;
        auto decoded = vae.forward({load(c, "latents.npy") * (1.0 / 0.18215)}).toTensor();
        EXPECT_LE(max_abs_diff(decoded, load(c, "decoded.npy")), 1e-3) << c;
    }
}

// The ResNet blocks on blocked activations (the CLI's default with --prepack on,
// where the CPU has a blocked route), the other convolutions prepacked, fused
// attention: the dense stages' tolerances against the fixtures, and close to the
// same stages on the plain route.
TEST(Stages, BlockedResNetBlocksMatchTheReference) {
    c10::InferenceMode guard;
    if (sd::blocked_route_block() == 0) GTEST_SKIP() << "no blocked route on this CPU";
    auto unet = stage("unet.pt"), vae = stage("vae_decoder.pt");
    auto plain_unet = stage("unet.pt"), plain_vae = stage("vae_decoder.pt");
    // The tiny UNet (2 levels): 12 ResBlocks, a Downsample, an Upsample; its VAE decoder
    // (4 levels of 2 blocks, the middle's 2): 10 ResnetBlocks, 3 upsamplers.
    EXPECT_EQ(sd::prepack_blocked(unet), 14);
    EXPECT_EQ(sd::prepack_blocked(vae), 13);
    EXPECT_EQ(sd::prepack_blocked(unet), 0) << "a second call finds nothing left to switch";
    sd::prepack_convolutions(unet);
    sd::prepack_convolutions(vae);
    for (auto* m : {&unet, &vae, &plain_unet, &plain_vae}) sd::set_attention(*m, sd::parse_attention("fused"));
    for (const auto& c : kCases) {
        auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
        auto ctx = load(c, "unet_context.npy");
        for (int64_t k : {int64_t(0), xs.size(0) - 1}) {
            const auto out = unet.forward({xs[k], ts[k], ctx}).toTensor();
            EXPECT_LE(max_abs_diff(out, outs[k]), 2e-4) << c << " call " << k;
            EXPECT_LE(max_abs_diff(out, plain_unet.forward({xs[k], ts[k], ctx}).toTensor()), 1e-4) << c;
        }
        const auto z = load(c, "latents.npy") * (1.0 / 0.18215);
        auto decoded = vae.forward({z}).toTensor();
        EXPECT_LE(max_abs_diff(decoded, load(c, "decoded.npy")), 1e-3) << c;
        EXPECT_LE(max_abs_diff(decoded, plain_vae.forward({z}).toTensor()), 1e-4) << c;
    }
}

// The sampler alone: replay the reference UNet outputs in call order and check
// that the sampler asks for the same (x, t) and walks the same steps.
TEST(Stages, SamplerStepsReplayingReferenceUnet) {
    c10::InferenceMode guard;
    for (const auto& c : kCases) {
        auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
        auto steps_x = load(c, "steps_x.npy"), steps_x0 = load(c, "steps_pred_x0.npy");
        auto noise = load(c, "start_noise.npy");
        const std::string sampler = c.find("ddim") != std::string::npos ? "ddim" : "plms";
        const int64_t n = noise.size(0);
        sdtest::ReplayedUnet unet{xs, ts, outs, n, 7.5, c};
        sd::EpsFn eps = [&](const at::Tensor& x, const at::Tensor& t) { return unet(x, t); };
        const double tol = 1e-4 * steps_x.abs().max().item<double>();
        sd::StepFn on_step = [&](int i, int, const at::Tensor& x, const at::Tensor& x0) {
            EXPECT_LE(max_abs_diff(x, steps_x[i]), tol) << c << " step " << i;
            EXPECT_LE(max_abs_diff(x0, steps_x0[i]), 1e-4 * steps_x0.abs().max().item<double>()) << c << " step " << i;
        };
        const int requested = static_cast<int>(steps_x.size(0));
        const auto ac = sdtest::model_alphas_cumprod(sdtest::test_models() + "/tiny-st");
        ASSERT_EQ(ac.size(), 1000u);
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
        sd::SamplerSettings settings;
        settings.sampler = sampler;
        settings.steps = requested;
        auto latents = sd::sample(settings, eps, noise, ac, gen, on_step);
        EXPECT_EQ(unet.calls, xs.size(0)) << c << ": number of UNet calls";
        EXPECT_LE(max_abs_diff(latents, load(c, "latents.npy")), 1e-4 * load(c, "latents.npy").abs().max().item<double>()) << c;
    }
}

TEST(Stages, TimestepsIncludeTheExtraStep) {
    auto ts = sd::compvis_timesteps(30, 1000);
    EXPECT_EQ(ts.size(), 31u);
    EXPECT_EQ(ts.front(), 1);
    EXPECT_EQ(ts.back(), 991);
    auto t50 = sd::compvis_timesteps(50, 1000);
    EXPECT_EQ(t50.size(), 50u);
    EXPECT_EQ(t50.back(), 981);
}

TEST(Stages, CorruptStageFileIsAClearError) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/garbage.pt", "this is not a zip archive");
    try {
        sd::load_stage(dir + "/garbage.pt");
        FAIL() << "no error";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("garbage.pt"), std::string::npos);
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
}

// What fails inside scripted code arrives as the TorchScript traceback; the
// CLI shows its last line, the one that names the fault.
TEST(Stages, ScriptErrorLineIsTheTracebacksLastLine) {
    EXPECT_EQ(sd::script_error_line("The following operation failed in the TorchScript interpreter.\n"
                                    "Traceback of TorchScript, serialized code (most recent call last):\n"
                                    "  File \"code/__torch__/m.py\", line 12, in forward\n"
                                    "RuntimeError: Given groups=1, weight of size [3, 16, 3, 3]\n\n"),
              "RuntimeError: Given groups=1, weight of size [3, 16, 3, 3]");
    EXPECT_EQ(sd::script_error_line("one line"), "one line");
    EXPECT_EQ(sd::script_error_line(" \n\n"), "unknown error");
}

// --weights q8 narrows the UNet's layers at load and copies the rest (biases, norms)
// out of the weights file, so nothing maps the file afterwards: a mapped bias could
// bring whole page-cache folios of the released layers back into the process on the
// first forward (engine/q8_weights.cpp).
TEST(Stages, Q8UnetLeavesItsWeightFileUnmapped) {
    const std::string path = sdtest::test_models() + "/tiny-st/unet.pt";
    auto mappings = [] {
        std::ifstream maps("/proc/self/maps");
        int n = 0;
        for (std::string line; std::getline(maps, line);) n += line.find("tiny-st/unet.weights") != std::string::npos;
        return n;
    };
    c10::InferenceMode guard;  // as the CLI loads its stages
    {
        const auto plain = sd::load_stage(path);
        EXPECT_GT(mappings(), 0) << "the float stage maps its weights file";
    }
    ASSERT_EQ(mappings(), 0);
    int narrowed = 0;
    const auto q8 = sd::load_stage(path, at::kFloat, c10::kCPU, nullptr,
                                   [&](torch::jit::Module& m) { narrowed = sd::narrow_to_q8(m, path); });
    EXPECT_GT(narrowed, 0);
    EXPECT_EQ(mappings(), 0);
    for (const auto& p : q8.parameters())
        if (p.is_floating_point()) EXPECT_EQ(p.scalar_type(), at::kFloat);
}
