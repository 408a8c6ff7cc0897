// TAESD (tests/fixtures/taesd): the decoder against the original code's
// outputs, stage by stage and through the CLI, with the README's tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "conformance_util.h"
#include "engine/blocked_operators.h"
#include "engine/taesd.h"
#include "io/image_io.h"
#include "io/npy.h"
#include "kernels/linear_kernel.h"
#include "sd/error.h"
#include "test_util.h"

namespace {

std::string taesd_dir() { return sdtest::fixtures() + "/taesd"; }
std::string case_dir(const std::string& name) { return taesd_dir() + "/cases/" + name; }

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// taesd_out ([0, 1]) and decoded (2x - 1) within 1e-4 x max|reference| (README "Tolerances").
// winograd: the blocked route's Winograd convolutions (TaesdDecoder::decode).
void expect_decode_matches(const sd::TaesdDecoder& d, const std::string& name, bool winograd = false) {
    const auto latents = sdtest::load_tensor(case_dir(name) + "/latents.npy");
    const auto ref_out = sdtest::load_tensor(case_dir(name) + "/taesd_out.npy");
    const auto ref_decoded = sdtest::load_tensor(case_dir(name) + "/decoded.npy");
    at::Tensor out;
    {
        c10::InferenceMode guard;
        out = d.decode(latents, winograd);
        // The route ran: its rounding is not the direct convolutions'.
        if (winograd) EXPECT_FALSE(at::equal(out, d.decode(latents))) << name << ": Winograd did not run";
    }
    ASSERT_EQ(out.sizes(), ref_out.sizes());
    std::cout << name << ": taesd_out max diff " << sdtest::max_abs_diff(out, ref_out) << " (max|ref| "
              << max_abs(ref_out) << "), decoded max diff " << sdtest::max_abs_diff(out * 2.0 - 1.0, ref_decoded) << "\n";
    EXPECT_LE(sdtest::max_abs_diff(out, ref_out), 1e-4 * max_abs(ref_out)) << name << " taesd_out";
    EXPECT_LE(sdtest::max_abs_diff(out * 2.0 - 1.0, ref_decoded), 1e-4 * max_abs(ref_decoded)) << name << " decoded";
}

}  // namespace

TEST(TaesdDecoder, DiffusersFolderMatchesReference) {
    const auto d = sd::TaesdDecoder::load(taesd_dir() + "/taesd_tiny");
    EXPECT_EQ(d.channels(), 16);
    expect_decode_matches(d, "tiny_decode_encode");
}

// madebyollin's file: fp16 tensors read into fp32, keys "{i}.*".
TEST(TaesdDecoder, PthMatchesReference) {
    const auto d = sd::TaesdDecoder::load(taesd_dir() + "/taesd_decoder.pth");
    EXPECT_EQ(d.channels(), 64);
    expect_decode_matches(d, "pth_decode_latents");
}

// fp32 with the plan's Winograd route: blocked activations, Winograd convolutions.
TEST(TaesdDecoder, WinogradRouteMatchesReference) {
    if (!sd::winograd_available()) GTEST_SKIP() << "no Winograd convolutions on this CPU or build";
    expect_decode_matches(sd::TaesdDecoder::load(taesd_dir() + "/taesd_tiny"), "tiny_decode_encode", true);
    expect_decode_matches(sd::TaesdDecoder::load(taesd_dir() + "/taesd_decoder.pth"), "pth_decode_latents", true);
}

// --precision bf16 runs TAESD in bf16, channels-last (TaesdDecoder::to): near the fp32
// reference, and a plain NCHW picture out.
TEST(TaesdDecoder, BfloatChannelsLastNearTheReference) {
    if (!sd::kernels::cpu_has_bf16()) GTEST_SKIP() << "this CPU has no bf16 instructions";
    auto d = sd::TaesdDecoder::load(taesd_dir() + "/taesd_decoder.pth");
    d.to(c10::kCPU, at::kBFloat16);
    const auto latents = sdtest::load_tensor(case_dir("pth_decode_latents") + "/latents.npy");
    const auto ref = sdtest::load_tensor(case_dir("pth_decode_latents") + "/taesd_out.npy");
    at::Tensor out;
    {
        c10::InferenceMode guard;
        out = d.decode(latents.to(at::kBFloat16));
    }
    ASSERT_EQ(out.sizes(), ref.sizes());
    EXPECT_TRUE(out.is_contiguous());
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    const double diff = sdtest::max_abs_diff(out.to(at::kFloat), ref), rel = diff / max_abs(ref);
    std::cout << "bf16 TAESD: max diff " << diff << " (" << rel << " of max|ref|)\n";
    EXPECT_GT(diff, 0) << "identical to fp32: bf16 was not used";
    EXPECT_LT(rel, 0.05);
}

// The variation the README says must fail: the latents divided by the VAE's
// scale factor first (TAESD takes the UNet's latents as they are).
TEST(TaesdDecoder, ScaledLatentsFailTheTolerance) {
    const auto d = sd::TaesdDecoder::load(taesd_dir() + "/taesd_tiny");
    const auto latents = sdtest::load_tensor(case_dir("tiny_decode_encode") + "/latents.npy");
    const auto ref_out = sdtest::load_tensor(case_dir("tiny_decode_encode") + "/taesd_out.npy");
    c10::InferenceMode guard;
    EXPECT_GT(sdtest::max_abs_diff(d.decode(latents / 0.18215), ref_out), 1e-4 * max_abs(ref_out));
    const auto pth = sd::TaesdDecoder::load(taesd_dir() + "/taesd_decoder.pth");
    const auto pth_latents = sdtest::load_tensor(case_dir("pth_decode_latents") + "/latents.npy");
    const auto pth_ref = sdtest::load_tensor(case_dir("pth_decode_latents") + "/taesd_out.npy");
    EXPECT_GT(sdtest::max_abs_diff(pth.decode(pth_latents / 0.18215), pth_ref), 1e-4 * max_abs(pth_ref));
}

// Bad files: one line naming the file and what is wrong.
TEST(TaesdDecoder, RefusesBadInputWithOneLine) {
    const std::string dir = sdtest::temp_dir();
    auto message = [](const std::string& path) {
        try {
            sd::TaesdDecoder::load(path);
        } catch (const sd::Error& e) {
            return std::string(e.what());
        }
        return std::string("(loaded)");
    };
    // A folder without the weights file.
    const std::string empty = dir + "/empty_folder";
    std::filesystem::create_directories(empty);
    EXPECT_NE(message(empty).find("has no diffusion_pytorch_model.safetensors"), std::string::npos) << message(empty);
    // Truncated and garbage .safetensors.
    const std::string full = sdtest::read_text(taesd_dir() + "/taesd_tiny/diffusion_pytorch_model.safetensors");
    sdtest::write_text(dir + "/cut.safetensors", full.substr(0, full.size() / 2));
    EXPECT_NE(message(dir + "/cut.safetensors").find("cut.safetensors is corrupt"), std::string::npos)
        << message(dir + "/cut.safetensors");
    sdtest::write_text(dir + "/junk.safetensors", "\xff\xff\xff\xff\xff\xff\xff\x7fjunk");
    EXPECT_NE(message(dir + "/junk.safetensors").find("junk.safetensors"), std::string::npos);
    // Not a TAESD: the full VAE's weights.
    const std::string vae = sdtest::test_models() + "/tiny-st/vae_decoder.weights";
    sdtest::write_text(dir + "/vae.safetensors", sdtest::read_text(vae));
    EXPECT_NE(message(dir + "/vae.safetensors").find("lacks the tensor 1.weight"), std::string::npos)
        << message(dir + "/vae.safetensors");
    EXPECT_NE(message(dir + "/missing.pth").find("does not exist"), std::string::npos);
    const std::string pth = sdtest::read_text(taesd_dir() + "/taesd_decoder.pth");
    sdtest::write_text(dir + "/cut.pth", pth.substr(0, pth.size() / 2));
    EXPECT_NE(message(dir + "/cut.pth").find("cut.pth"), std::string::npos) << message(dir + "/cut.pth");
    EXPECT_EQ(message(dir + "/cut.pth").find('\n'), std::string::npos) << message(dir + "/cut.pth");
    for (const std::string& m : {message(empty), message(dir + "/cut.safetensors"), message(dir + "/vae.safetensors")})
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

TEST(TaesdDecoder, SpecNeedsAPath) {
    EXPECT_EQ(sd::taesd_path_of("taesd:x.pth", "--vae-decoder"), "x.pth");
    EXPECT_THROW(sd::taesd_path_of("taesd:", "--vae-decoder"), sd::Error);
    EXPECT_THROW(sd::taesd_path_of("x.pth", "--vae-decoder"), sd::Error);
}

namespace {

// The txt2img cases through the CLI: latents as ../lora/README.md (1e-4 x
// max|ref|), images 1 level on at most 0.1% of values.
void check_txt2img_case(const std::string& name, const std::string& taesd) {
    const auto a = sdtest::read_json(case_dir(name) + "/args.json");
    const std::string out = sdtest::temp_dir();
    auto r = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out + "/img", "--quiet",
                          "--prompt", a.at("prompt").get<std::string>(), "--seed", std::to_string(a.at("seed").get<int>()),
                          "--H", std::to_string(a.at("H").get<int>()), "--W", std::to_string(a.at("W").get<int>()),
                          "--steps", std::to_string(a.at("num_inference_steps").get<int>()), "--sampler", "ddim",
                          "--scale", std::to_string(a.at("guidance_scale").get<double>()), "--threads", "1",
                          "--save-latents", out + "/latents.npy", "--vae-decoder", "taesd:" + taesd});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto ref = sdtest::load_tensor(case_dir(name) + "/latents.npy");
    const auto got = sdtest::load_tensor(out + "/latents.npy");
    ASSERT_EQ(got.sizes(), ref.sizes());
    EXPECT_LE(sdtest::max_abs_diff(got, ref), 1e-4 * max_abs(ref)) << name << " latents";
    std::cout << name << ": latents max diff " << sdtest::max_abs_diff(got, ref) << " (max|ref| " << max_abs(ref) << ")\n";
    const auto paths = sdtest::lines(r.out);
    ASSERT_EQ(paths.size(), 1u) << r.out;
    const auto img = sd::read_png(paths[0]);
    const auto ref_img = sd::read_npy(case_dir(name) + "/image.npy");  // [1, H, W, 3] uint8
    ASSERT_EQ(img.height, ref_img.shape[1]);
    ASSERT_EQ(img.width, ref_img.shape[2]);
    int max_diff = 0;
    int64_t differing = 0;
    for (size_t k = 0; k < img.rgb.size(); ++k) {
        const int d = std::abs(int(img.rgb[k]) - int(ref_img.as<uint8_t>()[k]));
        max_diff = std::max(max_diff, d);
        differing += d > 0;
    }
    std::cout << name << ": image max diff " << max_diff << " levels on " << differing << " of " << img.rgb.size() << "\n";
    EXPECT_LE(max_diff, 1) << name;
    EXPECT_LE(differing, static_cast<int64_t>(img.rgb.size()) / 1000) << name;
}

}  // namespace

TEST(TaesdCli, PthTxt2ImgMatchesReference) {
    check_txt2img_case("pth_txt2img_ddim10_64x64", taesd_dir() + "/taesd_decoder.pth");
}

TEST(TaesdCli, DiffusersFolderTxt2ImgMatchesReference) {
    check_txt2img_case("tiny_txt2img_ddim10_64x96", taesd_dir() + "/taesd_tiny");
}
