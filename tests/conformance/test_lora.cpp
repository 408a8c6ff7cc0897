// LoRA on the tiny SD 1.x model against diffusers' runs (tests/fixtures/lora):
// the merged weights (merged.safetensors, 1e-5), the text encoder and one UNet
// call with the LoRA merged, and whole images through the CLI from --lora, from
// a <lora:NAME:W> tag, two stacked LoRAs and a diffusers-format file.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/script.h>

#include "conformance_util.h"
#include "engine/lora_merge.h"
#include "engine/stage_loader.h"
#include "sd/error.h"
#include "io/weight_file.h"
#include "test_util.h"

namespace {

const std::vector<std::string> kCases = {"la_m1.0_ddim10_64x64", "la_m0.6_ddim10_64x96", "la0.6_lb1.0_stacked_ddim10_64x64",
                                         "lb_diffusers_m0.8_ddim10_64x64"};

std::string lora_dir() { return sdtest::fixtures() + "/lora"; }
std::string case_dir(const std::string& c) { return lora_dir() + "/cases/" + c; }
std::string model() { return sdtest::test_models() + "/tiny-st"; }
at::Tensor load(const std::string& c, const std::string& file) { return sdtest::load_tensor(case_dir(c) + "/" + file); }

// The case's LoRAs: (file, multiplier) in the order they were fused.
std::vector<std::pair<std::string, double>> case_loras(const std::string& c) {
    std::vector<std::pair<std::string, double>> out;
    const auto args = sdtest::read_json(case_dir(c) + "/args.json");  // kept: the loop reads into it
    for (const auto& l : args.at("loras"))
        out.emplace_back(l.at(0).get<std::string>(), l.at(1).get<double>());
    return out;
}

sd::LoraTargets tiny_targets() {
    return {sd::read_weight_index(model() + "/unet.weights"), sd::read_weight_index(model() + "/text_encoder.weights")};
}

// The case's LoRAs with every multiplier lowered by `lower` (the fixtures' must-FAIL variation).
std::vector<sd::LoraMerge> merges(const std::string& c, double lower = 0) {
    const auto targets = tiny_targets();
    std::vector<sd::LoraMerge> out;
    for (const auto& [file, m] : case_loras(c))
        out.push_back({sd::read_lora(lora_dir() + "/" + file, targets), m - lower, m - lower});
    return out;
}

torch::jit::Module merged_stage(const std::string& stage, const std::vector<sd::LoraMerge>& loras) {
    const std::string which = stage == "unet.pt" ? "unet" : "text_encoder";
    return sd::load_stage(model() + "/" + stage, at::kFloat, c10::kCPU, nullptr,
                          [&](torch::jit::Module& m) { sd::merge_loras(m, which, loras); });
}

// merged.safetensors's F32 tensors, under this tool's stage and parameter names.
std::map<std::string, at::Tensor> reference_merged(const std::string& c) {
    const std::string path = case_dir(c) + "/merged.safetensors";
    std::ifstream f(path, std::ios::binary);
    std::map<std::string, at::Tensor> out;
    for (const auto& w : sd::read_weight_index(path)) {
        EXPECT_EQ(w.dtype, "F32") << w.name;
        at::Tensor t = at::empty(w.shape, at::kFloat);
        f.seekg(static_cast<std::streamoff>(w.begin));
        f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(w.end - w.begin));
        std::string name = w.name;
        for (const std::string prefix : {"model.diffusion_model.", "cond_stage_model.transformer."})
            if (name.rfind(prefix, 0) == 0)
                name = (prefix[0] == 'm' ? "unet:" : "text_encoder:") + name.substr(prefix.size());
        out[name] = t;
    }
    return out;
}

// Largest difference of the stages' merged parameters to merged.safetensors.
double merged_error(const std::string& c, const std::vector<sd::LoraMerge>& loras) {
    const auto ref = reference_merged(c);
    EXPECT_EQ(ref.size(), 17u) << c;
    double worst = 0;
    size_t found = 0;
    for (const std::string stage : {"unet", "text_encoder"}) {
        auto m = merged_stage(stage + ".pt", loras);
        for (const auto& p : m.named_parameters(true)) {
            auto it = ref.find(stage + ":" + p.name);
            if (it == ref.end()) continue;
            ++found;
            EXPECT_EQ(p.value.sizes(), it->second.sizes()) << p.name;
            worst = std::max(worst, (p.value - it->second).abs().max().item<double>());
        }
    }
    EXPECT_EQ(found, ref.size()) << c << ": merged.safetensors names a tensor the stages lack";
    return worst;
}

}  // namespace

TEST(LoraMerge, MergedWeightsMatchDiffusersFuse) {
    c10::InferenceMode guard;
    for (const auto& c : kCases) EXPECT_LE(merged_error(c, merges(c)), 1e-5) << c;
}

// The fixtures' must-FAIL variation (multiplier 0.1 lower) is caught at this tolerance.
TEST(LoraMerge, MultiplierPointOneLowerFails) {
    c10::InferenceMode guard;
    for (const auto& c : {kCases[0], kCases[2]}) EXPECT_GT(merged_error(c, merges(c, 0.1)), 1e-3) << c;
}

// A file whose (finite) values are far too large is refused while the stage loads, naming the
// file and the module: in fp32 when the change overflows it, in fp16 when the merged weight
// passes fp16's range (it would be Inf there and NaN after sampling); fp32 holds the latter.
TEST(LoraMerge, ValuesBeyondTheHeldTypeAreRefusedNamingTheFile) {
    c10::InferenceMode guard;
    const std::string q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
    const auto file_of = [&](const std::string& name, double value) {
        const std::string path = sdtest::temp_dir() + "/" + name + ".safetensors";
        sdtest::write_f32_safetensors(path, {{q + ".lora_down.weight", at::full({4, 32}, value)},
                                             {q + ".lora_up.weight", at::full({32, 4}, value)}});
        return std::vector<sd::LoraMerge>{{sd::read_lora(path, tiny_targets()), 1.0, 1.0}};
    };
    const auto refusal = [&](const std::vector<sd::LoraMerge>& l, at::ScalarType held) {
        try {
            sd::load_stage(model() + "/unet.pt", held, c10::kCPU, nullptr,
                           [&](torch::jit::Module& m) { sd::merge_loras(m, "unet", l, held); });
        } catch (const sd::Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    const std::string huge = refusal(file_of("huge", 1e20), at::kFloat);  // 4 * 1e40: past fp32
    EXPECT_NE(huge.find("huge.safetensors"), std::string::npos) << huge;
    EXPECT_NE(huge.find(q), std::string::npos) << huge;
    EXPECT_NE(huge.find("beyond fp32's range"), std::string::npos) << huge;
    const auto large = file_of("large", 200);  // 4 * 40000 = 160000: fp32 holds it, fp16 does not
    EXPECT_EQ(refusal(large, at::kFloat), "");
    const std::string half = refusal(large, at::kHalf);
    EXPECT_NE(half.find("large.safetensors"), std::string::npos) << half;
    EXPECT_NE(half.find("beyond fp16's range"), std::string::npos) << half;
    EXPECT_EQ(refusal(file_of("fine", 1), at::kHalf), "");
}

// Only the targets change: every other parameter keeps the export's value, and every target changes.
TEST(LoraMerge, OnlyTargetsChange) {
    c10::InferenceMode guard;
    const auto loras = merges(kCases[0]);
    size_t targets = 0;
    for (const auto& m : loras[0].file.modules) targets += m.stage == "unet";
    auto base = sd::load_stage(model() + "/unet.pt");
    auto merged = merged_stage("unet.pt", loras);
    std::map<std::string, at::Tensor> before;
    for (const auto& p : base.named_parameters(true)) before[p.name] = p.value;
    size_t changed = 0;
    for (const auto& p : merged.named_parameters(true)) changed += !at::equal(p.value, before.at(p.name));
    EXPECT_EQ(changed, targets);
    EXPECT_EQ(loras[0].file.modules.size(), 129u);  // lora_a's modules, all mapped
    EXPECT_EQ(targets, 117u);                        // less the text encoder's 2 x 6
}

// fp16 weights (--weights fp16) still apply after the merge: the merge is fp32, then converted.
TEST(LoraMerge, HalfWeightsAfterMerge) {
    c10::InferenceMode guard;
    const auto loras = merges(kCases[0]);
    auto m = sd::load_stage(model() + "/unet.pt", at::kHalf, c10::kCPU, nullptr,
                            [&](torch::jit::Module& s) { sd::merge_loras(s, "unet", loras); });
    const auto ref = reference_merged(kCases[0]);
    for (const auto& p : m.named_parameters(true)) {
        EXPECT_EQ(p.value.scalar_type(), at::kHalf) << p.name;
        if (auto it = ref.find("unet:" + p.name); it != ref.end())
            EXPECT_LE((p.value.to(at::kFloat) - it->second).abs().max().item<double>(),
                      1e-3 * it->second.abs().max().item<double>())
                << p.name;
    }
}

TEST(LoraStages, TextEncoderWithLoraMatchesCond) {
    c10::InferenceMode guard;
    for (const auto& c : kCases) {
        auto te = merged_stage("text_encoder.pt", merges(c));
        EXPECT_LE(sdtest::max_abs_diff(te.forward({load(c, "tokens.npy")}).toTensor(), load(c, "cond.npy")), 1e-4) << c;
        EXPECT_LE(sdtest::max_abs_diff(te.forward({load(c, "uncond_tokens.npy")}).toTensor(), load(c, "uncond.npy")), 1e-4)
            << c;
    }
}

TEST(LoraStages, UnetWithLoraMatchesCalls) {
    c10::InferenceMode guard;
    for (const auto& c : kCases) {
        auto unet = merged_stage("unet.pt", merges(c));
        auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
        auto ctx = load(c, "unet_context.npy");
        for (int64_t k : {int64_t(0), xs.size(0) - 1})
            EXPECT_LE(sdtest::max_abs_diff(unet.forward({xs[k], ts[k], ctx}).toTensor(), outs[k]), 2e-4) << c << " call " << k;
    }
}

namespace {

// The case's CLI line without its LoRAs: DDIM 10 steps, guidance 7.5, one image, one thread.
std::vector<std::string> case_args(const std::string& c, const std::string& model_dir, const std::string& prompt_suffix = "") {
    const auto a = sdtest::read_json(case_dir(c) + "/args.json");
    return {sdtest::cli(), "--model", model_dir, "--outdir", sdtest::temp_dir(), "--quiet", "--threads", "1",
            "--seed", std::to_string(a.at("seed").get<long long>()), "--H", std::to_string(a.at("H").get<int>()),
            "--W", std::to_string(a.at("W").get<int>()), "--steps", std::to_string(a.at("num_inference_steps").get<int>()),
            "--sampler", "ddim", "--scale", std::to_string(a.at("guidance_scale").get<double>()),
            "--prompt", a.at("prompt").get<std::string>() + prompt_suffix};
}

std::vector<std::string> with_flags(std::vector<std::string> args, const std::string& c, double lower = 0) {
    for (const auto& [file, m] : case_loras(c)) args.insert(args.end(), {"--lora", lora_dir() + "/" + file + ":" + std::to_string(m - lower)});
    return args;
}

}  // namespace

TEST(LoraCli, FromLoraFlag) { sdtest::check_cli_run(case_dir(kCases[0]), with_flags(case_args(kCases[0], model()), kCases[0]), sdtest::temp_dir()); }

TEST(LoraCli, FromPromptTag) {
    auto args = case_args(kCases[1], model(), " <lora:lora_a:0.6>");
    args.insert(args.end(), {"--lora-dir", lora_dir()});
    sdtest::check_cli_run(case_dir(kCases[1]), args, sdtest::temp_dir());
}

TEST(LoraCli, TwoStacked) { sdtest::check_cli_run(case_dir(kCases[2]), with_flags(case_args(kCases[2], model()), kCases[2]), sdtest::temp_dir()); }

TEST(LoraCli, DiffusersFormat) { sdtest::check_cli_run(case_dir(kCases[3]), with_flags(case_args(kCases[3], model()), kCases[3]), sdtest::temp_dir()); }

// The must-FAIL variation through the CLI: multipliers 0.1 lower are far outside the latents' tolerance.
TEST(LoraCli, MultiplierPointOneLowerFails) {
    const std::string out = sdtest::temp_dir();
    auto args = with_flags(case_args(kCases[2], model()), kCases[2], 0.1);
    args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
    auto r = sdtest::run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(sdtest::latents_relative_error(case_dir(kCases[2]), out + "/latents.npy"), 1e-2);
}


// LoRAs baked in by the export (export_model.py --lora, the export_tiny_lora test): the stacked
// case without any --lora at run time.
TEST(LoraExport, BakedStackedCase) {
    const std::string baked = sdtest::test_models() + "/tiny-lora-stacked";
    sdtest::check_cli_run(case_dir(kCases[2]), case_args(kCases[2], baked), sdtest::temp_dir());
    // And it is not the plain model: the same line there is far from the case.
    const std::string out = sdtest::temp_dir();
    auto args = case_args(kCases[2], model());
    args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
    ASSERT_EQ(sdtest::run(args).exit_code, 0);
    EXPECT_GT(sdtest::latents_relative_error(case_dir(kCases[2]), out + "/latents.npy"), 1e-2);
}

// LyCORIS's LoHa and LoKr modules (lora_keys.h). No reference run made these, so they
// are tied to the fixtures by identities: lora_a rewritten as a LoHa whose second
// factor is all ones, and as a LoKr whose w1 is [[1]], changes the weights exactly as
// lora_a does, which matches diffusers' fuse. Each kind's product is also checked
// against its formula written out as loops.
namespace {

std::string rewritten_lora_a(const std::string& kind) {
    return sdtest::lora_as_lycoris(lora_dir() + "/lora_a.safetensors", kind,
                                   sdtest::temp_dir() + "/lora_a_" + kind + ".safetensors");
}

}  // namespace

TEST(LycorisMerge, LohaAndLokrOfTheFixtureLoraMatchDiffusersFuse) {
    c10::InferenceMode guard;
    const auto lora = merges(kCases[0]);
    const auto unet = merged_stage("unet.pt", lora), te = merged_stage("text_encoder.pt", lora);
    for (const std::string kind : {"loha", "lokr"}) {
        const std::vector<sd::LoraMerge> l = {{sd::read_lora(rewritten_lora_a(kind), tiny_targets()), 1.0, 1.0}};
        ASSERT_EQ(l[0].file.modules.size(), 129u) << kind;
        EXPECT_LE(merged_error(kCases[0], l), 1e-5) << kind;
        // The same bits as lora_a's own merge: a product by exact ones changes nothing.
        for (const auto& [stage, plain] : {std::pair{"unet", &unet}, std::pair{"text_encoder", &te}}) {
            const auto merged = merged_stage(std::string(stage) + ".pt", l);
            std::map<std::string, at::Tensor> want;
            for (const auto& p : plain->named_parameters(true)) want[p.name] = p.value;
            for (const auto& p : merged.named_parameters(true)) EXPECT_TRUE(at::equal(p.value, want.at(p.name))) << kind << " " << p.name;
        }
    }
}

// Each kind's product against its formula as loops: a LoHa with CP factors, a LoKr
// with a product w1 and a conv w2, a LoKr with a CP w2, and LoCon's CP middle, on
// the tiny UNet's first 3x3 conv [32, 32, 3, 3].
TEST(LycorisMerge, DeltasFollowTheirFormulas) {
    c10::InferenceMode guard;
    at::manual_seed(7);
    const std::string c = "lora_unet_down_blocks_0_resnets_0_conv1";
    const auto r = [](std::vector<int64_t> s) { return at::randn(s, at::kDouble); };
    const at::Tensor t1 = r({3, 4, 3, 3}), a1 = r({3, 32}), b1 = r({4, 32}), t2 = r({2, 2, 3, 3}), a2 = r({2, 32}),
                     b2 = r({2, 32});
    const at::Tensor k1a = r({4, 2}), k1b = r({2, 8}), k2 = r({8, 4, 3, 3});
    const at::Tensor kt = r({2, 3, 3, 3}), ka = r({2, 4}), kb = r({3, 4}), kw1 = r({8, 8});
    const at::Tensor down = r({5, 32, 1, 1}), mid = r({6, 5, 3, 3}), up = r({32, 6, 1, 1});
    const at::Tensor alpha = at::full({}, 3.0, at::kDouble);
    const std::string dir = sdtest::temp_dir();
    sdtest::write_f32_safetensors(dir + "/loha.safetensors", {{c + ".alpha", alpha}, {c + ".hada_t1", t1}, {c + ".hada_w1_a", a1},
                                                      {c + ".hada_w1_b", b1}, {c + ".hada_t2", t2}, {c + ".hada_w2_a", a2},
                                                      {c + ".hada_w2_b", b2}});
    // A CP first factor with a plain second one (its product goes in row chunks).
    const at::Tensor p2a = r({32, 2}), p2b = r({2, 288});
    sdtest::write_f32_safetensors(dir + "/loha_t1.safetensors", {{c + ".alpha", alpha}, {c + ".hada_t1", t1}, {c + ".hada_w1_a", a1},
                                                         {c + ".hada_w1_b", b1}, {c + ".hada_w2_a", p2a}, {c + ".hada_w2_b", p2b}});
    sdtest::write_f32_safetensors(dir + "/lokr.safetensors",
                          {{c + ".alpha", alpha}, {c + ".lokr_w1_a", k1a}, {c + ".lokr_w1_b", k1b}, {c + ".lokr_w2", k2}});
    sdtest::write_f32_safetensors(dir + "/lokr_cp.safetensors", {{c + ".alpha", alpha}, {c + ".lokr_w1", kw1}, {c + ".lokr_t2", kt},
                                                         {c + ".lokr_w2_a", ka}, {c + ".lokr_w2_b", kb}});
    sdtest::write_f32_safetensors(dir + "/mid.safetensors", {{c + ".alpha", alpha}, {c + ".lora_down.weight", down},
                                                     {c + ".lora_mid.weight", mid}, {c + ".lora_up.weight", up}});
    // The inputs as the file holds them (fp32), in double for the loops.
    const auto f = [](const at::Tensor& x) { return x.to(at::kFloat).to(at::kDouble); };
    const auto cp = [&](const at::Tensor& t, const at::Tensor& a, const at::Tensor& b, int64_t kh, int64_t kw) {
        auto T = f(t), A = f(a), B = f(b);
        at::Tensor out = at::zeros({A.size(1), B.size(1), kh, kw}, at::kDouble);
        auto o = out.accessor<double, 4>();
        auto ta = T.accessor<double, 4>();
        auto aa = A.accessor<double, 2>();
        auto ba = B.accessor<double, 2>();
        for (int64_t p = 0; p < A.size(1); ++p)
            for (int64_t q = 0; q < B.size(1); ++q)
                for (int64_t k = 0; k < kh; ++k)
                    for (int64_t l = 0; l < kw; ++l)
                        for (int64_t i = 0; i < T.size(0); ++i)
                            for (int64_t j = 0; j < T.size(1); ++j) o[p][q][k][l] += ta[i][j][k][l] * aa[i][p] * ba[j][q];
        return out;
    };
    const auto kron4 = [&](const at::Tensor& w1, const at::Tensor& w2) {
        auto A = w1.accessor<double, 2>();
        auto B = w2.accessor<double, 4>();
        const int64_t c2 = w2.size(0), d2 = w2.size(1);
        at::Tensor out = at::empty({w1.size(0) * c2, w1.size(1) * d2, w2.size(2), w2.size(3)}, at::kDouble);
        auto o = out.accessor<double, 4>();
        for (int64_t i = 0; i < w1.size(0); ++i)
            for (int64_t j = 0; j < w1.size(1); ++j)
                for (int64_t p = 0; p < c2; ++p)
                    for (int64_t q = 0; q < d2; ++q)
                        for (int64_t k = 0; k < w2.size(2); ++k)
                            for (int64_t l = 0; l < w2.size(3); ++l) o[i * c2 + p][j * d2 + q][k][l] = A[i][j] * B[p][q][k][l];
        return out;
    };
    // Scales: alpha over w1_b's rank (LoHa: 4), w1_b's (LoKr with a whole w2: 2), w2_b's (3), down's (5).
    const std::vector<std::pair<std::string, at::Tensor>> want = {
        {"loha", cp(t1, a1, b1, 3, 3) * cp(t2, a2, b2, 3, 3) * (3.0 / 4)},
        {"loha_t1", cp(t1, a1, b1, 3, 3) * f(p2a).mm(f(p2b)).reshape({32, 32, 3, 3}) * (3.0 / 4)},
        {"lokr", kron4(f(k1a).mm(f(k1b)), f(k2)) * (3.0 / 2)},
        {"lokr_cp", kron4(f(kw1), cp(kt, ka, kb, 3, 3)) * (3.0 / 3)},
        {"mid", cp(mid, up.flatten(1).t(), down.flatten(1), 3, 3) * (3.0 / 5)}};
    for (const auto& [name, expected] : want) {
        const auto file = sd::read_lora(dir + "/" + name + ".safetensors", tiny_targets());
        ASSERT_EQ(file.modules.size(), 1u) << name;
        const at::Tensor got = sd::lora_delta(file, file.modules[0], {32, 32, 3, 3}).to(at::kDouble);
        EXPECT_LE((got - expected).abs().max().item<double>(), 1e-5 * expected.abs().max().item<double>()) << name;
        EXPECT_GT(expected.abs().max().item<double>(), 0) << name;
    }
}

// A plain LoHa's second product is multiplied in a row chunk at a time (kLohaRowChunkBytes):
// on a [2048, 1024] layer that is 8 chunks of 256 rows, and the result is the whole formula.
TEST(LycorisMerge, LohaSecondProductInRowChunks) {
    c10::InferenceMode guard;
    at::manual_seed(3);
    const std::string q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
    sd::WeightEntry target;
    target.name = "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight";
    target.dtype = "F32";
    target.shape = {2048, 1024};
    ASSERT_GT(target.shape[0], 2 * sd::kLohaRowChunkBytes / 4 / target.shape[1]) << "more than two chunks";
    const at::Tensor a1 = at::randn({2048, 4}), b1 = at::randn({4, 1024}), a2 = at::randn({2048, 3}), b2 = at::randn({3, 1024});
    const std::string path = sdtest::temp_dir() + "/loha_big.safetensors";
    sdtest::write_f32_safetensors(path, {{q + ".alpha", at::full({}, 2.0)}, {q + ".hada_w1_a", a1}, {q + ".hada_w1_b", b1},
                                         {q + ".hada_w2_a", a2}, {q + ".hada_w2_b", b2}});
    sd::LoraTargets targets;
    targets.unet = {target};
    const auto file = sd::read_lora(path, targets);
    ASSERT_EQ(file.modules.size(), 1u);
    const at::Tensor got = sd::lora_delta(file, file.modules[0], {2048, 1024}).to(at::kDouble);
    const auto d = [](const at::Tensor& x) { return x.to(at::kDouble); };
    const at::Tensor want = d(a1).mm(d(b1)) * d(a2).mm(d(b2)) * (2.0 / 4);
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>());
}

// A rewritten lora_a through the CLI: --lora with a LoHa file gives the case's image.
TEST(LycorisCli, LohaFileFromLoraFlag) {
    auto args = case_args(kCases[0], model());
    args.insert(args.end(), {"--lora", rewritten_lora_a("loha") + ":1.0"});
    sdtest::check_cli_run(case_dir(kCases[0]), args, sdtest::temp_dir());
}

// DoRA (LyCORIS's weight decomposition) tied to the fixtures: lora_a with,
// for every module, a magnitude dora_scale = u * the norms of lora_a's merged weight
// along one axis (u random in [0.5, 1.5] per row or column) merges to that weight times
// u along that axis; diffusers' merged.safetensors checks the weights it holds.
namespace {

std::vector<int64_t> all_but(int64_t dims, int axis) {
    std::vector<int64_t> out;
    for (int64_t d = 0; d < dims; ++d)
        if (d != axis) out.push_back(d);
    return out;
}

// lora_a plus a dora_scale per module: magnitude(the merged weight, stage:param) gives it.
std::string lora_a_with_dora(const std::string& name, const std::function<at::Tensor(const at::Tensor&, const std::string&)>& magnitude) {
    const auto plain = merges(kCases[0]);
    std::map<std::string, at::Tensor> merged;  // stage:param -> lora_a merged at 1
    for (const std::string stage : {"unet", "text_encoder"})
        for (const auto& p : merged_stage(stage + ".pt", plain).named_parameters(true)) merged[stage + ":" + p.name] = p.value;
    auto tensors = sdtest::read_f32_safetensors(lora_dir() + "/lora_a.safetensors");
    for (const auto& m : plain[0].file.modules) {
        const std::string where = m.stage + ":" + m.param;
        tensors.emplace_back(m.key + ".dora_scale", magnitude(merged.at(where), where));
    }
    const std::string path = sdtest::temp_dir() + "/" + name + ".safetensors";
    sdtest::write_f32_safetensors(path, tensors);
    return path;
}

}  // namespace

TEST(DoraMerge, MagnitudesRescaleTheFixtureMergeAlongTheirAxis) {
    c10::InferenceMode guard;
    at::manual_seed(11);
    const auto ref = reference_merged(kCases[0]);
    for (int axis : {0, 1}) {
        std::map<std::string, at::Tensor> want, factor;  // stage:param -> the merged weight times u; u
        const std::string path = lora_a_with_dora("dora" + std::to_string(axis), [&](const at::Tensor& w, const std::string& where) {
            const at::Tensor norm = at::linalg_vector_norm(w, 2, all_but(w.dim(), axis), /*keepdim=*/true);
            factor[where] = at::rand(norm.sizes()) + 0.5;
            want[where] = w * factor[where];
            return norm * factor[where];
        });
        const std::vector<sd::LoraMerge> dora = {{sd::read_lora(path, tiny_targets()), 1.0, 1.0}};
        ASSERT_EQ(dora[0].file.modules.size(), 129u);
        size_t checked = 0, against_diffusers = 0;
        for (const std::string stage : {"unet", "text_encoder"}) {
            for (const auto& p : merged_stage(stage + ".pt", dora).named_parameters(true)) {
                const std::string where = stage + ":" + p.name;
                const auto it = want.find(where);
                if (it == want.end()) continue;
                ++checked;
                EXPECT_LE((p.value - it->second).abs().max().item<double>(), 1e-6 * it->second.abs().max().item<double>())
                    << axis << " " << where;
                if (const auto r = ref.find(where); r != ref.end()) {
                    ++against_diffusers;
                    EXPECT_LE((p.value - r->second * factor.at(where)).abs().max().item<double>(), 2e-5) << axis << " " << where;
                    EXPECT_GT((p.value - r->second).abs().max().item<double>(), 1e-3) << "u changed nothing: " << where;
                }
            }
        }
        EXPECT_EQ(checked, want.size());
        EXPECT_EQ(against_diffusers, ref.size());
    }
}

// At a multiplier m the merge is W + m * (decompose(W + D) - W) (as ComfyUI's
// weight_decompose applies its strength; LyCORIS's own interpolation agrees at m = 1), per axis, on
// a random W of the 3x3 conv and of a square linear layer, against the formula in double.
TEST(DoraMerge, FollowsItsFormulaAtAnyMultiplier) {
    c10::InferenceMode guard;
    at::manual_seed(5);
    const std::string c = "lora_unet_down_blocks_0_resnets_0_conv1", q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
    for (const auto& [key, shape] : {std::pair{c, std::vector<int64_t>{32, 32, 3, 3}}, std::pair{q, std::vector<int64_t>{32, 32}}}) {
        std::vector<int64_t> down_shape = {4, 32}, up_shape = {32, 4};
        if (shape.size() == 4) down_shape = {4, 32, 3, 3}, up_shape = {32, 4, 1, 1};
        const at::Tensor down = at::randn(down_shape), up = at::randn(up_shape) * 0.1, w0 = at::randn(shape);
        for (int axis : {0, 1}) {
            const at::Tensor magnitude = at::rand(sd::dora_shape(shape, axis)) * 5 + 1;
            const std::string path = sdtest::temp_dir() + "/dora_formula.safetensors";
            sdtest::write_f32_safetensors(path, {{key + ".alpha", at::full({}, 2.0)}, {key + ".lora_down.weight", down},
                                                 {key + ".lora_up.weight", up}, {key + ".dora_scale", magnitude}});
            const auto file = sd::read_lora(path, tiny_targets());
            ASSERT_EQ(file.modules.size(), 1u);
            for (double m : {1.0, 0.7, -0.5}) {
                at::Tensor w = w0.clone();
                sd::apply_lora(w, file, file.modules[0], m);
                // In double, with loops over the axis's slices for the norms.
                const at::Tensor W = w0.to(at::kDouble);
                const at::Tensor merged = W + up.flatten(1).to(at::kDouble).mm(down.flatten(1).to(at::kDouble)).reshape(shape) * 0.5;
                at::Tensor decomposed = merged.clone();
                for (int64_t i = 0; i < shape[axis]; ++i) {
                    at::Tensor slice = decomposed.select(axis, i);
                    slice.mul_(magnitude.flatten()[i].item<double>() / slice.pow(2).sum().sqrt().item<double>());
                }
                const at::Tensor expected = W + m * (decomposed - W);
                EXPECT_LE((w.to(at::kDouble) - expected).abs().max().item<double>(), 1e-5 * expected.abs().max().item<double>())
                    << key << " axis " << axis << " m " << m;
            }
        }
    }
}

// lora_a with magnitudes equal to its merged weight's norms through the CLI gives the case's image.
TEST(DoraCli, FileFromLoraFlag) {
    const std::string path = lora_a_with_dora("dora_same", [](const at::Tensor& w, const std::string&) {
        return at::linalg_vector_norm(w, 2, all_but(w.dim(), 1), /*keepdim=*/true);
    });
    auto args = case_args(kCases[0], model());
    args.insert(args.end(), {"--lora", path + ":1.0"});
    sdtest::check_cli_run(case_dir(kCases[0]), args, sdtest::temp_dir());
}

// 8-bit UNet layers (--weights q8) are narrowed from the merged fp32 weights: the stacked
// case's LoRAs merged at run time give, under q8, the latents of the export that baked them
// (export_model.py --lora) under q8, within fp32's rounding of the two merges; without
// the LoRAs the latents are far from both.
TEST(LoraQ8, RunTimeMergeMatchesTheBakedExport) {
    const auto latents = [&](const std::string& model_dir, bool loras) {
        const std::string out = sdtest::temp_dir();
        auto args = case_args(kCases[2], model_dir);
        if (loras) args = with_flags(args, kCases[2]);
        args.insert(args.end(), {"--weights", "q8", "--save-latents", out + "/latents.npy"});
        const auto r = sdtest::run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.exit_code == 0 ? sdtest::load_tensor(out + "/latents.npy") : at::zeros({1});
    };
    const at::Tensor merged = latents(model(), true), baked = latents(sdtest::test_models() + "/tiny-lora-stacked", false),
                     plain = latents(model(), false);
    const double scale = baked.abs().max().item<double>();
    EXPECT_LE(sdtest::max_abs_diff(merged, baked) / scale, 1e-3);
    EXPECT_GT(sdtest::max_abs_diff(plain, baked) / scale, 0.1);
}
