// SDXL LoRAs and textual-inversion embeddings against diffusers v0.26.3
// (tests/fixtures/sdxl-lora/README.md, tests/fixtures/sdxl-embeddings/README.md):
// every public case through the CLI, from the single file and from the diffusers
// folder, with diffusers' schedulers (--schedule leading / trailing) and the size
// conditioning given explicitly; the LoRA key mapping of all three files; the
// pooled row at argmax(ids) with an embedding in the text.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "conformance_util.h"
#include "engine/embeddings.h"
#include "engine/lora_merge.h"
#include "engine/sdxl_conditioning.h"
#include "engine/stage_loader.h"
#include "engine/sampling_loop.h"
#include "io/lora_keys.h"
#include "io/png_text.h"
#include "io/weight_file.h"
#include "sd/error.h"
#include "sd/from_png.h"
#include "sd/model_config.h"
#include "sd/tokenizer.h"
#include "text/prompt_weights.h"
#include "test_util.h"

namespace {

std::string lora_dir() { return sdtest::fixtures() + "/sdxl-lora"; }
std::string emb_dir() { return sdtest::fixtures() + "/sdxl-embeddings"; }
std::string model(const std::string& from) { return sdtest::test_models() + "/sdxl-" + from; }
double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

std::vector<std::string> case_names(const std::string& set_dir) {
    std::vector<std::string> out;
    const auto index = sdtest::read_json(set_dir + "/cases/index.json");
    for (auto it = index.begin(); it != index.end(); ++it) out.push_back(it.key());
    return out;
}

// The flags that reproduce one case's diffusers run (README "Scheduler, guidance, conditioning").
std::vector<std::string> case_args(const std::string& set_dir, const std::string& c, const std::string& from,
                                   const std::string& out) {
    const auto a = sdtest::read_json(set_dir + "/cases/" + c + "/args.json");
    const auto& sched = a["scheduler"];
    const std::string cls = sched["class"].get<std::string>();
    const std::string spacing = sched["config"]["timestep_spacing"].get<std::string>();
    const int H = a["H"].get<int>(), W = a["W"].get<int>();
    const auto& size = a["size_conditioning"];
    auto wxh = [](const nlohmann::json& hw) {
        return std::to_string(hw[1].get<int>()) + "x" + std::to_string(hw[0].get<int>());
    };
    std::vector<std::string> v = {sdtest::cli(), "--model", model(from), "--outdir", out + "/img", "--quiet",
                                  "--threads", "1", "--sampler", cls == "DDIMScheduler" ? "ddim" : "euler",
                                  "--schedule", spacing, "--scale", std::to_string(a["guidance_scale"].get<double>()),
                                  "--steps", std::to_string(a["num_inference_steps"].get<int>()), "--seed",
                                  std::to_string(a["seed"].get<long long>()), "--H", std::to_string(H), "--W",
                                  std::to_string(W), "--n_samples", std::to_string(a["n"].get<int>()),
                                  "--original-size", wxh(size["original_size"]), "--target-size",
                                  wxh(size["target_size"]), "--crop-coords",
                                  std::to_string(size["crops_coords_top_left"][0].get<int>()) + "," +
                                      std::to_string(size["crops_coords_top_left"][1].get<int>()),
                                  "--prompt", a["prompt"].get<std::string>()};
    if (!a["negative_prompt"].is_null()) v.insert(v.end(), {"--negative-prompt", a["negative_prompt"].get<std::string>()});
    if (!a["loras"].is_null())
        for (const auto& l : a["loras"])
            v.insert(v.end(), {"--lora", set_dir + "/" + l[0].get<std::string>() + ":" +
                                             std::to_string(l[1].get<double>())});
    if (!a["embeddings"].is_null())
        for (const auto& e : a["embeddings"]) v.insert(v.end(), {"--embedding", set_dir + "/" + e[0].get<std::string>()});
    return v;
}

using Case = std::tuple<std::string, std::string, std::string>;  // set, case, layout

struct SdxlAddonCli : ::testing::TestWithParam<Case> {};

TEST_P(SdxlAddonCli, MatchesDiffusers) {
    const auto& [set, c, from] = GetParam();
    const std::string dir = set == "lora" ? lora_dir() : emb_dir();
    const std::string out = sdtest::temp_dir();
    sdtest::check_cli_run(dir + "/cases/" + c, case_args(dir, c, from, out), out);
}

std::vector<Case> all_cases() {
    std::vector<Case> out;
    for (const char* from : {"st", "diffusers"}) {
        for (const auto& c : case_names(lora_dir())) out.emplace_back("lora", c, from);
        for (const auto& c : case_names(emb_dir())) out.emplace_back("emb", c, from);
    }
    return out;
}

std::string case_label(const ::testing::TestParamInfo<Case>& info) {
    std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
    for (auto& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return name;
}

INSTANTIATE_TEST_SUITE_P(SdxlAddons, SdxlAddonCli, ::testing::ValuesIn(all_cases()), case_label);

// The same LoRA named by the prompt's A1111 tag, found in --lora-dir, gives the case.
TEST(SdxlAddonCliVariation, PromptTagFindsTheLora) {
    const std::string c = "xa_m1.0_euler10_64x64", out = sdtest::temp_dir();
    auto args = case_args(lora_dir(), c, "st", out);
    args.erase(args.end() - 2, args.end());  // the --lora
    args.back() += " <lora:xl_lora_a:1>";   // the prompt
    args.insert(args.end(), {"--lora-dir", lora_dir()});
    sdtest::check_cli_run(lora_dir() + "/cases/" + c, args, out);
}

// The must-FAIL variations through the CLI: without the LoRA, or with the
// embeddings loaded the other way round (another added token is the largest id,
// so the pooled row moves), the latents are far off.
TEST(SdxlAddonCliVariation, LoraAndEmbeddingOrderMatter) {
    {
        const std::string c = "xa_m1.0_euler10_64x64", out = sdtest::temp_dir();
        auto args = case_args(lora_dir(), c, "st", out);
        args.erase(args.end() - 2, args.end());  // the --lora
        args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
        auto r = sdtest::run(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_GT(sdtest::latents_relative_error(lora_dir() + "/cases/" + c, out + "/latents.npy"), 0.1);
    }
    {
        const std::string c = "e_both_g1_batch2_euler8_96x64", out = sdtest::temp_dir();
        auto args = case_args(emb_dir(), c, "st", out);
        std::swap(args[args.size() - 1], args[args.size() - 3]);  // xlthree before xlone
        args.insert(args.end(), {"--save-latents", out + "/latents.npy"});
        auto r = sdtest::run(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_GT(sdtest::latents_relative_error(emb_dir() + "/cases/" + c, out + "/latents.npy"), 1e-3);
    }
}

// LoRAs baked in by the export (export_model.py --lora, the export_sdxl_lora test):
// the stacked case without any --lora at run time.
TEST(SdxlLoraExport, BakedStackedCase) {
    const std::string c = "xa0.6_xb1.0_stacked_neg_euler10_96x64", out = sdtest::temp_dir();
    auto args = case_args(lora_dir(), c, "lora-stacked", out);
    args.erase(args.end() - 4, args.end());  // the two --lora
    sdtest::check_cli_run(lora_dir() + "/cases/" + c, args, out);
}

// The text stage of every case: both tokenizations (added tokens at diffusers' ids,
// in load order), crossattn and pooled with the text-encoder LoRAs merged or the
// embeddings' vectors in place, the encoded negative too; pooled at argmax(ids).
TEST(SdxlAddonStages, TokensCrossattnAndPooledOfEveryCase) {
    c10::InferenceMode guard;
    const std::string m = model("st");
    const auto cfg = sd::load_model_config(m);
    auto tok = sd::ClipTokenizer::load(cfg.vocab_path, cfg.merges_path);
    sd::LoraTargets targets;
    targets.unet = sd::read_weight_index(m + "/unet.weights");
    targets.text_encoder = sd::read_weight_index(m + "/text_encoder.weights");
    targets.text_encoder_2 = sd::read_weight_index(m + "/text_encoder_2.weights");
    for (const auto& [set, dir] : {std::pair{"lora", lora_dir()}, std::pair{"emb", emb_dir()}}) {
        for (const auto& c : case_names(dir)) {
            const std::string cd = dir + "/cases/" + c;
            const auto a = sdtest::read_json(cd + "/args.json");
            std::vector<sd::LoraMerge> merges;
            if (!a["loras"].is_null())
                for (const auto& l : a["loras"]) {
                    const double w = l[1].get<double>();
                    merges.push_back({sd::read_lora(dir + "/" + l[0].get<std::string>(), targets), w, w});
                }
            auto te1 = sd::load_stage(m + "/text_encoder.pt", at::kFloat, c10::kCPU, nullptr,
                                      [&](torch::jit::Module& s) { sd::merge_loras(s, "text_encoder", merges); });
            auto te2 = sd::load_stage(m + "/text_encoder_2.pt", at::kFloat, c10::kCPU, nullptr,
                                      [&](torch::jit::Module& s) { sd::merge_loras(s, "text_encoder_2", merges); });
            std::vector<std::string> files;
            if (!a["embeddings"].is_null())
                for (const auto& e : a["embeddings"]) files.push_back(dir + "/" + e[0].get<std::string>());
            const auto embs = sd::load_embeddings(files, cfg.sdxl.text_encoder_width, 75, cfg.sdxl.text_encoder_2_width);
            const auto added = sd::added_words(embs, 49408);
            // Token ids as diffusers numbers them.
            const std::string prompt = a["prompt"].get<std::string>();
            for (auto [file, pad] : {std::pair{"tokens_l.npy", cfg.pad_id}, {"tokens_g.npy", cfg.sdxl.text_encoder_2_pad_id}}) {
                const auto chunks = sd::tokenize_prompt(tok, prompt, {}, 77, cfg.bos_id, cfg.eos_id, pad, added);
                EXPECT_TRUE(at::equal(at::tensor(chunks.ids.at(0), at::kLong), sdtest::load_tensor(cd + "/" + file)[0]))
                    << c << " " << file;
            }
            const at::Tensor x1 = sd::embedding_table(embs, cfg.sdxl.text_encoder_width);
            const at::Tensor x2 = sd::embedding_table(embs, cfg.sdxl.text_encoder_2_width, true);
            sd::SdxlEncoders enc;
            enc.first = [&](const at::Tensor& ids) { return sd::encode_ids(te1, ids, 0, x1); };
            enc.second = [&](const at::Tensor& ids) { return sd::encode_ids_pooled(te2, ids, 0, x2); };
            const int n = a["n"].get<int>(), H = a["H"].get<int>(), W = a["W"].get<int>();
            const std::string neg = a["negative_prompt"].is_null() ? "" : a["negative_prompt"].get<std::string>();
            auto got = sd::encode_sdxl_conditioning(enc, enc, tok, cfg, std::vector<std::string>(n, prompt),
                                                    std::vector<std::string>(n, neg), {}, {H, W, 0, 0, H, W}, added);
            const at::Tensor cond = sdtest::load_tensor(cd + "/cond_crossattn.npy");
            const double tol = std::max(1e-4, 1e-5 * max_abs(cond));
            EXPECT_LE(sdtest::max_abs_diff(got.cond, cond), tol) << c;
            EXPECT_LE(sdtest::max_abs_diff(got.cond_y.slice(1, 0, 48), sdtest::load_tensor(cd + "/pooled.npy")), tol) << c;
            if (!neg.empty()) {
                EXPECT_LE(sdtest::max_abs_diff(got.uncond, sdtest::load_tensor(cd + "/uncond_crossattn.npy")), tol) << c;
                EXPECT_LE(sdtest::max_abs_diff(got.uncond_y.slice(1, 0, 48), sdtest::load_tensor(cd + "/uncond_pooled.npy")),
                          tol)
                    << c;
            }
        }
    }
}

// SDXL's sgm flavour is the default schedule's only: with --schedule leading or
// trailing, euler, euler_a and dpmpp_2m on SDXL do diffusers' arithmetic, the same
// as on SD 1.x (whose leading/trailing runs follow diffusers' fixtures), while
// the default schedule does differ. A model that answers with its input.
TEST(SdxlSchedules, LeadingAndTrailingAreDiffusersOnSdxlToo) {
    c10::InferenceMode guard;
    const auto cfg = sd::load_model_config(model("st"));
    const sd::ModelFn fn = [](const at::Tensor& x, const at::Tensor& t) {
        return x * 0.1 + t.to(at::kFloat).view({-1, 1, 1, 1}) * 1e-3;
    };
    auto run = [&](const std::string& sampler, const std::string& schedule, bool sgm) {
        sd::SamplerSettings s;
        s.sampler = sampler;
        s.schedule = schedule;
        s.steps = 8;
        s.sgm = sgm;
        s.linear_start = cfg.linear_start;
        s.linear_end = cfg.linear_end;
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
        auto noise = at::randn({1, 4, 8, 8}, gen);
        return sd::sample(s, fn, noise, cfg.alphas_cumprod, gen);
    };
    // dpmpp_2m has no trailing schedule (core/sampler_list.h).
    for (auto [sampler, schedule] : {std::pair{"euler", "leading"}, {"euler", "trailing"}, {"euler_a", "leading"},
                                     {"euler_a", "trailing"}, {"dpmpp_2m", "leading"}})
        EXPECT_TRUE(at::equal(run(sampler, schedule, true), run(sampler, schedule, false))) << sampler << " " << schedule;
    for (const char* sampler : {"euler", "euler_a", "dpmpp_2m"})
        EXPECT_FALSE(at::equal(run(sampler, "default", true), run(sampler, "default", false))) << sampler;
}

namespace {

// The parameters a LoRA may change in the SDXL st export.
sd::LoraTargets xl_targets() {
    const std::string m = model("st");
    return {sd::read_weight_index(m + "/unet.weights"), sd::read_weight_index(m + "/text_encoder.weights"),
            sd::read_weight_index(m + "/text_encoder_2.weights")};
}

// Every parameter of one stage of the st export with `file` merged at multiplier w ("": none).
std::map<std::string, at::Tensor> xl_merged(const std::string& file, const std::string& stage, double w) {
    std::vector<sd::LoraMerge> merges;
    if (!file.empty()) merges.push_back({sd::read_lora(file, xl_targets()), w, w});
    std::map<std::string, at::Tensor> out;
    auto s = sd::load_stage(model("st") + "/" + stage + ".pt", at::kFloat, c10::kCPU, nullptr,
                            [&](torch::jit::Module& x) { sd::merge_loras(x, stage, merges); });
    for (const auto& p : s.named_parameters(true)) out[p.name] = p.value;
    return out;
}

}  // namespace

// Every module of the three files maps to a parameter of the exported model
// (the README's table: SGM block names, diffusers block names, the diffusers
// format; both text encoders), none is left over, and the ones the export does
// not build (CLIP-L's last layer, unused by SDXL) change nothing.
TEST(SdxlLoraKeys, EveryModuleOfTheFixturesMaps) {
    const sd::LoraTargets t = xl_targets();
    struct Want {
        const char* file;
        size_t unet, te1, te2;
    };
    // xl_lora_a: 257 UNet modules, 18 CLIP-L ones of which the 6 of layer 2 are not built, 24 bigG.
    for (const Want& w : {Want{"xl_lora_a.safetensors", 257, 12, 24}, Want{"xl_lora_b.safetensors", 136, 8, 16},
                          Want{"xl_lora_b_diffusers.safetensors", 136, 8, 16}}) {
        const auto f = sd::read_lora(lora_dir() + "/" + w.file, t);
        size_t unet = 0, te1 = 0, te2 = 0;
        for (const auto& mod : f.modules) (mod.stage == "unet" ? unet : mod.stage == "text_encoder" ? te1 : te2)++;
        EXPECT_EQ(unet, w.unet) << w.file;
        EXPECT_EQ(te1, w.te1) << w.file;
        EXPECT_EQ(te2, w.te2) << w.file;
    }
    const auto a = sd::read_lora(lora_dir() + "/xl_lora_a.safetensors", t);
    auto find = [&](const std::string& key) -> const sd::LoraModule* {
        for (const auto& mod : a.modules)
            if (mod.key == key) return &mod;
        return nullptr;
    };
    const auto* proj = find("lora_unet_input_blocks_4_1_proj_in");
    ASSERT_NE(proj, nullptr);
    EXPECT_EQ(proj->param, "input_blocks.4.1.proj_in.weight");
    EXPECT_DOUBLE_EQ(proj->scale(), 0.5);
    const auto* to_k = find("lora_unet_middle_block_1_transformer_blocks_1_attn2_to_k");
    ASSERT_NE(to_k, nullptr);
    EXPECT_DOUBLE_EQ(to_k->scale(), 0.25);
    const auto* te2 = find("lora_te2_text_model_encoder_layers_0_self_attn_q_proj");
    ASSERT_NE(te2, nullptr);
    EXPECT_EQ(te2->stage, "text_encoder_2");
    EXPECT_DOUBLE_EQ(te2->scale(), 1.5);
    // An SDXL LoRA on an SD 1.x model is refused by name, and the other way round.
    sd::LoraTargets sd1 = t;
    sd1.text_encoder_2.clear();
    try {
        sd::read_lora(lora_dir() + "/xl_lora_a.safetensors", sd1);
        ADD_FAILURE() << "no error";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("is a LoRA for SDXL"), std::string::npos) << e.what();
    }
    try {
        sd::read_lora(sdtest::fixtures() + "/lora/lora_a.safetensors", t);
        ADD_FAILURE() << "no error";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("lora_a.safetensors"), std::string::npos) << e.what();
    }
}

// xl_lora_a with a DoRA magnitude for every module it changes, u times the norms of its
// merged weight per output row (u random in [0.5, 1.5]), merges to that weight times u in
// the UNet and both text encoders: DoRA through SDXL's names and stages.
TEST(SdxlLycoris, DoraOfXlLoraARescalesItsMerge) {
    c10::InferenceMode guard;
    at::manual_seed(13);
    const std::string lora = lora_dir() + "/xl_lora_a.safetensors";
    const auto merged = [](const std::string& file, const std::string& stage) { return xl_merged(file, stage, 1.0); };
    const auto plain = sd::read_lora(lora, xl_targets());
    auto tensors = sdtest::read_f32_safetensors(lora);
    std::map<std::string, at::Tensor> want;  // stage:param -> the merged weight times u
    for (const std::string stage : {"unet", "text_encoder", "text_encoder_2"}) {
        const auto w = merged(lora, stage);
        for (const auto& mod : plain.modules) {
            if (mod.stage != stage) continue;
            const at::Tensor& weight = w.at(mod.param);
            std::vector<int64_t> rest;
            for (int64_t d = 1; d < weight.dim(); ++d) rest.push_back(d);
            const at::Tensor norm = at::linalg_vector_norm(weight, 2, rest, /*keepdim=*/true);
            const at::Tensor u = at::rand(norm.sizes()) + 0.5;
            tensors.emplace_back(mod.key + ".dora_scale", norm * u);
            want[stage + ":" + mod.param] = weight * u;
        }
    }
    const std::string file = sdtest::temp_dir() + "/xl_dora.safetensors";
    sdtest::write_f32_safetensors(file, tensors);
    size_t checked = 0;
    for (const std::string stage : {"unet", "text_encoder", "text_encoder_2"}) {
        size_t in_stage = 0;
        for (const auto& [name, w] : merged(file, stage)) {
            const auto it = want.find(stage + ":" + name);
            if (it == want.end()) continue;
            ++checked, ++in_stage;
            EXPECT_LE((w - it->second).abs().max().item<double>(), 1e-6 * it->second.abs().max().item<double>())
                << stage << " " << name;
        }
        EXPECT_GT(in_stage, 0u) << stage;
    }
    EXPECT_EQ(checked, want.size());
}

// xl_lora_a written again as a LyCORIS LoHa and LoKr (the same change, conformance_util.h)
// merges into the UNet and both text encoders exactly as xl_lora_a does: the LyCORIS kinds
// go through SDXL's key mapping, both text encoders and the layers the export leaves out.
TEST(SdxlLycoris, LohaAndLokrOfXlLoraAMergeAsItDoes) {
    c10::InferenceMode guard;
    const sd::LoraTargets t = xl_targets();
    const std::string lora = lora_dir() + "/xl_lora_a.safetensors";
    const auto merged = [](const std::string& file, const std::string& stage) { return xl_merged(file, stage, 0.7); };
    for (const std::string kind : {"loha", "lokr"}) {
        const std::string file = sdtest::lora_as_lycoris(lora, kind, sdtest::temp_dir() + "/xl_" + kind + ".safetensors");
        EXPECT_EQ(sd::read_lora(file, t).modules.size(), sd::read_lora(lora, t).modules.size()) << kind;
        for (const std::string stage : {"unet", "text_encoder", "text_encoder_2"}) {
            const auto want = merged(lora, stage), got = merged(file, stage), plain = merged("", stage);
            size_t changed = 0;
            for (const auto& [name, w] : want) {
                EXPECT_TRUE(at::equal(got.at(name), w)) << kind << " " << stage << " " << name;
                changed += !at::equal(plain.at(name), w);
            }
            EXPECT_GT(changed, 0u) << kind << " " << stage;  // the file changes the stage at all
        }
    }
}

// An SD 1.x embedding on SDXL, and an SDXL one on SD 1.x, are one line naming the file.
TEST(SdxlEmbeddingErrors, WrongFamilyIsOneLine) {
    const std::string sd1_emb = sdtest::fixtures() + "/embeddings";
    std::string one;
    for (const auto& e : std::filesystem::directory_iterator(sd1_emb))
        if (e.path().extension() == ".safetensors") one = e.path().string();
    ASSERT_FALSE(one.empty());
    auto r = sdtest::run({sdtest::cli(), "--model", model("st"), "--prompt", "a", "--outdir", sdtest::temp_dir(),
                          "--steps", "1", "--H", "64", "--W", "64", "--embedding", one});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("not an SDXL embedding"), std::string::npos) << r.err;
    try {  // as an SD 1.x model of this width loads it
        sd::load_embeddings({emb_dir() + "/xlone.safetensors"}, 32, 75);
        ADD_FAILURE() << "no error";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("is an SDXL embedding"), std::string::npos) << e.what();
    }
    const auto both = sd::load_embeddings({emb_dir() + "/xlthree.safetensors"}, 32, 75, 48);
    ASSERT_EQ(both.size(), 1u);
    EXPECT_EQ(both[0].trigger, "xlthree");
    EXPECT_EQ(both[0].vectors.sizes(), (std::vector<int64_t>{3, 32}));
    EXPECT_EQ(both[0].vectors_2.sizes(), (std::vector<int64_t>{3, 48}));
}

// SDXL's size conditioning goes into the PNG text (A1111's style, written only
// where it is not the image's own size) and --from-png reads it back: the remake
// is the same PNG, byte for byte; a remake told another crop is not.
TEST(SdxlFromPng, CustomSizeConditioningRemakesTheSamePng) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run({sdtest::cli(), "--model", model("st"), "--outdir", dir + "/first", "--quiet", "--threads", "1",
                          "--H", "64", "--W", "96", "--steps", "3", "--seed", "5", "--prompt", "a lighthouse at dusk",
                          "--original-size", "128x96", "--crop-coords", "8,16", "--target-size", "96x64"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto first = sdtest::lines(r.out);
    ASSERT_EQ(first.size(), 1u) << r.out;
    const std::string png = sdtest::read_text(first[0]);
    const std::string text = sd::png_read_text(std::vector<uint8_t>(png.begin(), png.end()))["parameters"];
    EXPECT_NE(text.find(", Original size: 128x96, Crop coords: \"8,16\", Target size: 96x64,"), std::string::npos) << text;

    auto again = sdtest::run({sdtest::cli(), "--model", model("st"), "--outdir", dir + "/again", "--quiet", "--threads",
                              "1", "--from-png", first[0]});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    ASSERT_EQ(sdtest::lines(again.out).size(), 1u) << again.out;
    EXPECT_EQ(sdtest::read_text(sdtest::lines(again.out)[0]), png);

    auto other = sdtest::run({sdtest::cli(), "--model", model("st"), "--outdir", dir + "/other", "--quiet", "--threads",
                              "1", "--crop-coords", "0,0", "--from-png", first[0]});
    ASSERT_EQ(other.exit_code, 0) << other.err;
    ASSERT_EQ(sdtest::lines(other.out).size(), 1u) << other.out;
    EXPECT_NE(sdtest::read_text(sdtest::lines(other.out)[0]), png);

    // Read back as recorded; a malformed value is one line naming the PNG.
    const auto rec = sd::parse_parameters_text(text, "x.png");
    EXPECT_EQ(rec.original_size, (std::pair<int, int>{128, 96}));
    EXPECT_EQ(rec.crop_coords, (std::pair<int, int>{8, 16}));
    EXPECT_EQ(rec.target_size, (std::pair<int, int>{96, 64}));
    try {
        sd::parse_parameters_text("a\nSteps: 3, Sampler: Euler, Crop coords: 8", "x.png");
        ADD_FAILURE() << "no error";
    } catch (const sd::Error& e) {
        EXPECT_EQ(std::string(e.what()), "x.png: \"Crop coords\" must be TOP,LEFT, got \"8\"");
    }
}

}  // namespace
