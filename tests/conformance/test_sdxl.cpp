// SDXL against the sdxl-tiny reference runs (Stability-AI's sgm,
// tests/fixtures/sdxl-tiny/README.md): both tokenizations, both text encoders
// and the pooled vector, the size embedding, the zeroed unconditional, one
// UNet call with its vector input, the VAE decode, sgm's discretization and
// samplers replaying the reference UNet, and every case through the CLI from
// the single file and the diffusers folder with per-head and all-heads attention.
#include <gtest/gtest.h>

#include <torch/script.h>

#include "conformance_util.h"
#include "engine/sampling_loop.h"
#include "engine/sdxl_conditioning.h"
#include "engine/stage_loader.h"
#include "core/schedule.h"
#include "sd/model_config.h"
#include "sd/tokenizer.h"
#include "test_util.h"

namespace {

const std::vector<std::string> kCases = {"px1_euler10_64x64", "px2_euler12_64x96", "px3_dpmpp2m15_96x64",
                                         "px4_euler_a10_batch2_64x64"};

std::string case_dir(const std::string& c) { return sdtest::fixtures() + "/sdxl-tiny/cases/" + c; }
at::Tensor load(const std::string& c, const std::string& file) { return sdtest::load_tensor(case_dir(c) + "/" + file); }
nlohmann::json args(const std::string& c) { return sdtest::read_json(case_dir(c) + "/args.json"); }
std::string model(const std::string& from = "st") { return sdtest::test_models() + "/sdxl-" + from; }
double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

std::string sampler_of(const nlohmann::json& a) {
    const std::string s = a["sampler"].get<std::string>();
    if (s == "EulerEDMSampler") return "euler";
    if (s == "EulerAncestralSampler") return "euler_a";
    if (s == "DPMPP2MSampler") return "dpmpp_2m";
    ADD_FAILURE() << "unknown reference sampler " << s;
    return s;
}

sd::SdxlEncoders stage_encoders(torch::jit::Module& te1, torch::jit::Module& te2) {
    sd::SdxlEncoders e;
    e.first = [&te1](const at::Tensor& ids) { return te1.forward({ids}).toTensor(); };
    e.second = [&te2](const at::Tensor& ids) {
        auto out = te2.run_method("forward_pooled", ids).toTuple();
        return std::pair{out->elements()[0].toTensor(), out->elements()[1].toTensor()};
    };
    return e;
}

}  // namespace

TEST(SdxlTokenizer, BothPaddingsAreTheReferences) {
    auto tok = sd::ClipTokenizer::load(model() + "/vocab.json", model() + "/merges.txt");
    const auto cfg = sd::load_model_config(model());
    EXPECT_EQ(cfg.pad_id, 49407);
    EXPECT_EQ(cfg.sdxl.text_encoder_2_pad_id, 0);
    for (const auto& c : kCases) {
        const auto a = args(c);
        for (auto [file, pad] : {std::pair{"tokens_l.npy", cfg.pad_id}, std::pair{"tokens_g.npy", cfg.sdxl.text_encoder_2_pad_id}}) {
            auto want = load(c, file)[0];
            auto ids = tok.encode_padded(a["prompt"].get<std::string>(), 77, cfg.bos_id, cfg.eos_id, pad);
            EXPECT_TRUE(at::equal(at::tensor(ids, at::kLong), want)) << c << " " << file;
        }
    }
}

TEST(SdxlConditioning, SizeEmbeddingIsTheReferences) {
    for (const auto& c : kCases) {
        const auto a = args(c);
        const int H = a["H"].get<int>(), W = a["W"].get<int>();
        auto got = sd::size_embedding({H, W, 0, 0, H, W}, 256);
        auto ref = load(c, "size_emb.npy")[0];
        EXPECT_LE(sdtest::max_abs_diff(got, ref), 1e-5) << c;
        // The must-FAIL variations: width before height (the non-square cases), another crop.
        if (H != W) EXPECT_GT(sdtest::max_abs_diff(sd::size_embedding({W, H, 0, 0, W, H}, 256), ref), 0.1) << c;
        EXPECT_GT(sdtest::max_abs_diff(sd::size_embedding({H, W, 0, 1, H, W}, 256), ref), 0.1) << c;
    }
}

TEST(SdxlStages, BothTextEncodersAndThePooledVector) {
    c10::InferenceMode guard;
    auto te1 = sd::load_stage(model() + "/text_encoder.pt");
    auto te2 = sd::load_stage(model() + "/text_encoder_2.pt");
    for (const auto& c : kCases) {
        EXPECT_LE(sdtest::max_abs_diff(te1.forward({load(c, "tokens_l.npy")}).toTensor(), load(c, "emb_l.npy")), 1e-4) << c;
        auto out = te2.run_method("forward_pooled", load(c, "tokens_g.npy")).toTuple();
        EXPECT_LE(sdtest::max_abs_diff(out->elements()[0].toTensor(), load(c, "emb_g.npy")), 1e-4) << c;
        EXPECT_LE(sdtest::max_abs_diff(out->elements()[1].toTensor(), load(c, "pooled_g.npy")), 1e-4) << c;
        EXPECT_LE(sdtest::max_abs_diff(te2.forward({load(c, "tokens_g.npy")}).toTensor(), load(c, "emb_g.npy")), 1e-4) << c;
    }
}

// The whole conditioning as the pipeline builds it: crossattn and vector, and
// the unconditional of the empty negative prompt: zeros but for the size part.
TEST(SdxlConditioning, CrossattnAndVectorOfEveryCase) {
    c10::InferenceMode guard;
    auto te1 = sd::load_stage(model() + "/text_encoder.pt");
    auto te2 = sd::load_stage(model() + "/text_encoder_2.pt");
    const auto cfg = sd::load_model_config(model());
    auto tok = sd::ClipTokenizer::load(cfg.vocab_path, cfg.merges_path);
    const auto enc = stage_encoders(te1, te2);
    for (const auto& c : kCases) {
        const auto a = args(c);
        const int n = a["n_samples"].get<int>(), H = a["H"].get<int>(), W = a["W"].get<int>();
        const std::vector<std::string> prompts(static_cast<size_t>(n), a["prompt"].get<std::string>());
        const std::vector<std::string> negatives(static_cast<size_t>(n), "");
        auto got = sd::encode_sdxl_conditioning(enc, enc, tok, cfg, prompts, negatives, {}, {H, W, 0, 0, H, W});
        EXPECT_LE(sdtest::max_abs_diff(got.cond, load(c, "cond_crossattn.npy")), 1e-4) << c;
        EXPECT_LE(sdtest::max_abs_diff(got.cond_y, load(c, "cond_vector.npy")), 1e-4) << c;
        EXPECT_TRUE(at::equal(got.uncond, load(c, "uncond_crossattn.npy"))) << c << ": zeros";
        EXPECT_LE(sdtest::max_abs_diff(got.uncond_y, load(c, "uncond_vector.npy")), 1e-4) << c;
        // The must-FAIL variation: the negative encoded instead of zeroed (" " tokenizes as "").
        auto spoken = sd::encode_sdxl_conditioning(enc, enc, tok, cfg, prompts, std::vector<std::string>(prompts.size(), " "),
                                                   {}, {H, W, 0, 0, H, W});
        EXPECT_GT(sdtest::max_abs_diff(spoken.uncond, load(c, "uncond_crossattn.npy")), 0.1) << c;
    }
}

// Long prompts and A1111 weighting across both encoders: a prompt past 75
// tokens gets a second window in both halves of the context; a weight changes
// both encoders' parts but not the pooled vector (the first window's output).
TEST(SdxlConditioning, LongAndWeightedPromptsUseBothEncoders) {
    c10::InferenceMode guard;
    auto te1 = sd::load_stage(model() + "/text_encoder.pt");
    auto te2 = sd::load_stage(model() + "/text_encoder_2.pt");
    const auto cfg = sd::load_model_config(model());
    auto tok = sd::ClipTokenizer::load(cfg.vocab_path, cfg.merges_path);
    const auto enc = stage_encoders(te1, te2);
    const int64_t w1 = cfg.sdxl.text_encoder_width;
    auto run = [&](const std::string& prompt, const std::string& negative) {
        return sd::encode_sdxl_conditioning(enc, enc, tok, cfg, {prompt}, {negative}, {}, {64, 64, 0, 0, 64, 64});
    };
    std::string long_prompt;
    for (int i = 0; i < 90; ++i) long_prompt += "red ";
    auto lng = run(long_prompt, "");
    EXPECT_EQ(lng.cond.size(1), 154);
    EXPECT_EQ(lng.uncond.size(1), 154) << "the zeroed negative is as long as the prompt";
    EXPECT_EQ(lng.cond.size(2), cfg.context_dim);
    auto plain = run("a photograph of an astronaut riding a horse", "");
    auto weighted = run("a photograph of an (astronaut:1.3) riding a horse", "");
    EXPECT_GT(max_abs(weighted.cond.slice(2, 0, w1) - plain.cond.slice(2, 0, w1)), 1e-3);
    EXPECT_GT(max_abs(weighted.cond.slice(2, w1) - plain.cond.slice(2, w1)), 1e-3);
    EXPECT_TRUE(at::equal(weighted.cond_y, plain.cond_y));
    // A negative prompt that is not empty is encoded, with its own pooled vector.
    auto neg = run("a photograph of an astronaut riding a horse", "blurry");
    EXPECT_GT(max_abs(neg.uncond), 0.1);
    EXPECT_GT(max_abs(neg.uncond_y.slice(1, 0, cfg.sdxl.pooled_dim)), 1e-3);
    EXPECT_TRUE(at::equal(neg.uncond_y.slice(1, cfg.sdxl.pooled_dim), plain.uncond_y.slice(1, cfg.sdxl.pooled_dim)));
}

TEST(SdxlStages, OneUnetCallEveryAttentionMode) {
    c10::InferenceMode guard;
    auto unet = sd::load_stage(model() + "/unet.pt");
    for (const std::string attention : {"fused", "full", "per-head", "chunked:7"}) {
        sd::set_attention(unet, sd::parse_attention(attention));
        for (const auto& c : kCases) {
            auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
            auto ctx = load(c, "unet_context.npy"), y = load(c, "unet_y.npy");
            EXPECT_EQ(ts.scalar_type(), at::kLong);
            for (int64_t k : {int64_t(0), xs.size(0) - 1}) {
                auto out = unet.forward({xs[k], ts[k], ctx, y}).toTensor();
                EXPECT_LE(sdtest::max_abs_diff(out, outs[k]), 2e-4) << c << " call " << k << " " << attention;
            }
        }
    }
}

TEST(SdxlStages, VaeDecode) {
    c10::InferenceMode guard;
    auto vae = sd::load_stage(model() + "/vae_decoder.pt");
    const auto cfg = sd::load_model_config(model());
    EXPECT_DOUBLE_EQ(cfg.scale_factor, 0.13025);
    for (const auto& c : kCases) {
        auto z = load(c, "latents.npy") * (1.0 / cfg.scale_factor);
        EXPECT_LE(sdtest::max_abs_diff(vae.forward({z}).toTensor(), load(c, "decoded.npy")), 1e-3) << c;
    }
}

TEST(SdxlSchedule, TimestepsAndSigmasAreSgms) {
    const auto cfg = sd::load_model_config(model());
    for (const auto& c : kCases) {
        const auto a = args(c);
        const int steps = a["steps"].get<int>();
        EXPECT_EQ(sd::sgm_timesteps(steps, 1000), a["timesteps"].get<std::vector<int>>()) << c;
        auto ref = load(c, "sigmas.npy");
        auto got = sd::sgm_sigmas(steps, cfg.alphas_cumprod, cfg.linear_start, cfg.linear_end);
        ASSERT_EQ(got.sizes(), ref.sizes()) << c;
        EXPECT_TRUE(at::equal(got, ref)) << c << ": sgm's float64 schedule, exactly";
        // From the float32 alphas_cumprod alone: within the README's 1e-6.
        auto approx = sd::sgm_sigmas(steps, cfg.alphas_cumprod, 0, 0);
        auto rel = ((approx - ref).abs() / ref.abs().clamp_min(1e-30)).slice(0, 0, -1).max().item<double>();
        EXPECT_LE(rel, 1e-6) << c;
    }
    EXPECT_EQ(sd::sgm_timesteps(12, 1000).at(1), 915);
    EXPECT_EQ(sd::sgm_timesteps(12, 1000).at(2), 832);
}

// The recorded UNet outputs replayed: the sampler must ask for the recorded
// x * c_in at the recorded integer timesteps, start from noise * sqrt(1 + s0^2)
// and walk the recorded steps (euler_a with the recorded noise of every step).
TEST(SdxlSampler, ReplayReferenceUnet) {
    c10::InferenceMode guard;
    const auto cfg = sd::load_model_config(model());
    for (const auto& c : kCases) {
        const auto a = args(c);
        auto noise = load(c, "start_noise.npy");
        const int64_t n = noise.size(0);
        sdtest::ReplayedUnet unet{load(c, "unet_x.npy"), load(c, "unet_t.npy"), load(c, "unet_out.npy"), n,
                                  a["scale"].get<double>(), c};
        auto steps_x = load(c, "steps_x.npy"), latents = load(c, "latents.npy");
        sd::ModelFn fn = [&](const at::Tensor& x, const at::Tensor& t) { return unet(x, t); };
        sd::StepFn on_step = [&](int i, int, const at::Tensor& x, const at::Tensor&) {
            EXPECT_LE(sdtest::max_abs_diff(x, steps_x[i]), 1e-4 * max_abs(steps_x)) << c << " step " << i;
        };
        sd::SamplerSettings s;
        s.sampler = sampler_of(a);
        s.steps = a["steps"].get<int>();
        s.sgm = true;
        s.linear_start = cfg.linear_start;
        s.linear_end = cfg.linear_end;
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
        auto start = at::randn(noise.sizes(), gen);
        ASSERT_TRUE(at::equal(start, noise)) << c;
        auto out = sd::sample(s, fn, start, cfg.alphas_cumprod, gen, on_step);
        EXPECT_EQ(unet.calls, a["unet_calls"].get<int64_t>()) << c;
        EXPECT_LE(sdtest::max_abs_diff(out, latents), 1e-4 * max_abs(latents)) << c;
        if (s.sampler == "euler_a") {  // one draw per step, the last one too, each the recorded one
            at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
            at::randn(noise.sizes(), fresh);
            auto step_noise = load(c, "step_noise.npy");
            for (int64_t k = 0; k < step_noise.size(0); ++k)
                EXPECT_TRUE(at::equal(at::randn(noise.sizes(), fresh), step_noise[k])) << c << " draw " << k;
            EXPECT_TRUE(at::equal(at::randn(noise.sizes(), gen), at::randn(noise.sizes(), fresh))) << c;
        } else {  // euler and dpmpp_2m draw nothing after the start noise
            at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(a["seed"].get<uint64_t>());
            at::randn(noise.sizes(), fresh);
            EXPECT_TRUE(at::equal(at::randn(noise.sizes(), gen), at::randn(noise.sizes(), fresh))) << c;
        }
    }
}

// ---- through the CLI ----

struct SdxlCli : ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(SdxlCli, MatchesReferenceRun) {
    const auto& [c, from, attention] = GetParam();
    const auto a = args(c);
    const std::string out = sdtest::temp_dir();
    sdtest::check_cli_run(case_dir(c),
                          {sdtest::cli(), "--model", model(from), "--outdir", out + "/img", "--quiet", "--threads", "1",
                           "--attention", attention, "--sampler", sampler_of(a), "--scale",
                           std::to_string(a["scale"].get<double>()), "--steps", std::to_string(a["steps"].get<int>()),
                           "--seed", std::to_string(a["seed"].get<long long>()), "--H", std::to_string(a["H"].get<int>()),
                           "--W", std::to_string(a["W"].get<int>()), "--n_samples",
                           std::to_string(a["n_samples"].get<int>()), "--prompt", a["prompt"].get<std::string>()},
                          out);
}

INSTANTIATE_TEST_SUITE_P(SdxlCases, SdxlCli,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("st", "diffusers"),
                                            ::testing::Values("per-head", "full")),
                         [](const auto& info) {
                             std::string att = std::get<2>(info.param) == "full" ? "full" : "perhead";
                             return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + att;
                         });

// The must-FAIL variation through the CLI: another crop moves the latents well past the tolerance.
TEST(SdxlCliVariation, CropChangesTheLatents) {
    const std::string c = "px1_euler10_64x64";
    const auto a = args(c);
    const std::string out = sdtest::temp_dir();
    auto r = sdtest::run({sdtest::cli(), "--model", model(), "--outdir", out + "/img", "--quiet", "--threads", "1",
                          "--sampler", "euler", "--scale", "5", "--steps", "10", "--seed", "42", "--H", "64", "--W", "64",
                          "--crop-coords", "0,1", "--prompt", a["prompt"].get<std::string>(), "--save-latents",
                          out + "/latents.npy"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(sdtest::latents_relative_error(case_dir(c), out + "/latents.npy"), 1e-2);
}

// A1111's prompt editing on SDXL, whose hires pass encodes its text again at its size
// (both encoders, the pooled vector): WHEN 0 is TO, 2.0 FROM through both passes, 1.0
// FROM in the first pass and TO in the second (text/prompt_schedule.h).
TEST(SdxlPromptEditing, EditsThroughBothHiresPasses) {
    auto latents = [](const std::string& prompt) {
        const std::string out = sdtest::temp_dir();
        auto r = sdtest::run({sdtest::cli(), "--model", model(), "--outdir", out + "/img", "--quiet", "--threads", "1",
                              "--sampler", "euler", "--steps", "3", "--seed", "3", "--H", "64", "--W", "64",
                              "--hires-scale", "1.5", "--hires-steps", "2", "--hires-strength", "0.5", "--prompt",
                              prompt, "--save-latents", out + "/latents.npy"});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.exit_code == 0 ? sdtest::load_tensor(out + "/latents.npy") : at::zeros({1});
    };
    const at::Tensor cat = latents("a cat"), dog = latents("a dog"), switched = latents("a [cat:dog:1.0]");
    EXPECT_TRUE(at::equal(latents("a [cat:dog:0]"), dog));
    EXPECT_TRUE(at::equal(latents("a [cat:dog:2.0]"), cat));
    EXPECT_GT(max_abs(switched - cat), 0);
    EXPECT_GT(max_abs(switched - dog), 0);
}

// ---- bad input ----

TEST(SdxlCliErrors, BadSizeConditioningIsOneLine) {
    for (const std::vector<std::string>& flags :
         {std::vector<std::string>{"--original-size", "0x0"}, {"--crop-coords", "1"}, {"--crop-coords", "a,b"},
          {"--crop-coords", "1,2,3"}, {"--target-size", "64"}, {"--target-size", "64x0"}}) {
        std::vector<std::string> cmd = {sdtest::cli(), "--model", model(), "--prompt", "a", "--outdir",
                                        sdtest::temp_dir()};
        cmd.insert(cmd.end(), flags.begin(), flags.end());
        auto r = sdtest::run(cmd);
        EXPECT_EQ(r.exit_code, 1) << flags[0] << " " << flags[1];
        EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
        EXPECT_NE(r.err.find(flags[0]), std::string::npos) << r.err;
    }
}
