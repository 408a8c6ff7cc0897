// LoRA files mapped onto a model's parameters (src/io/lora_keys.h), and the
// refusals: keys that match nothing, LoRAs for other models, broken files.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "io/lora_keys.h"
#include "io/sha256.h"
#include "sd/error.h"
#include "test_util.h"

namespace {

// A checkpoint's weights under this tool's stage names (the export drops these prefixes).
sd::LoraTargets targets_of(const std::string& checkpoint) {
    // Its header read here: checkpoints hold int64 tensors, which weight files never do.
    const std::string bytes = sdtest::read_text(checkpoint);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = len << 8 | static_cast<unsigned char>(bytes[i]);
    sd::LoraTargets t;
    const auto header = nlohmann::json::parse(bytes.substr(8, len));
    for (const auto& [name, e] : header.items()) {
        if (name == "__metadata__") continue;
        sd::WeightEntry w;
        w.name = name;
        w.dtype = e.at("dtype");
        w.shape = e.at("shape").get<std::vector<int64_t>>();
        for (const std::string prefix : {"model.diffusion_model.", "cond_stage_model.transformer."}) {
            if (w.name.rfind(prefix, 0) != 0) continue;
            w.name = w.name.substr(prefix.size());
            (prefix[0] == 'm' ? t.unet : t.text_encoder).push_back(w);
        }
    }
    return t;
}

const sd::LoraTargets& tiny() {
    static const sd::LoraTargets t = targets_of(sdtest::fixtures() + "/tiny/tiny.safetensors");
    return t;
}
const sd::LoraTargets& tiny2() {
    static const sd::LoraTargets t = targets_of(sdtest::fixtures() + "/tiny2/tiny2.safetensors");
    return t;
}

std::string lora(const std::string& name) { return sdtest::fixtures() + "/lora/" + name; }

std::map<std::string, const sd::LoraModule*> by_key(const sd::LoraFile& f) {
    std::map<std::string, const sd::LoraModule*> out;
    for (const auto& m : f.modules) out[m.key] = &m;
    return out;
}

// A .safetensors file in memory: (name, dtype, shape), data all 0x3c (fp16 1.0 in each half).
struct T {
    std::string name, dtype;
    std::vector<int64_t> shape;
};
std::string safetensors(const std::vector<T>& tensors) {
    nlohmann::json h = nlohmann::json::object();
    uint64_t offset = 0;
    for (const auto& t : tensors) {
        uint64_t n = t.dtype == "F64" ? 8 : t.dtype == "F32" ? 4 : t.dtype == "I8" ? 1 : 2;
        for (auto d : t.shape) n *= static_cast<uint64_t>(d);
        h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
        offset += n;
    }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    const uint64_t len = text.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(len >> (8 * i));
    return out + text + std::string(offset, '\x3c');
}

std::vector<T> module(const std::string& key, std::vector<int64_t> down, std::vector<int64_t> up, const std::string& dtype = "F32") {
    return {{key + ".lora_down.weight", dtype, down}, {key + ".lora_up.weight", dtype, up}};
}

std::string refusal(const std::string& bytes, const sd::LoraTargets& targets = tiny()) {
    try {
        sd::parse_lora(bytes, "x.safetensors", targets);
    } catch (const sd::Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(what.find('\n'), std::string::npos) << what;
        EXPECT_NE(what.find("x.safetensors"), std::string::npos) << what;
        return what;
    }
    ADD_FAILURE() << "accepted";
    return "";
}

}  // namespace

// Every tensor of the three fixture files belongs to a mapped module, and no two modules share a target.
TEST(LoraKeys, EveryKeyOfTheFixturesMaps) {
    for (const auto& [file, modules, tensors] : {std::tuple{"lora_a.safetensors", 129, 387},
                                                 std::tuple{"lora_b.safetensors", 56, 112},
                                                 std::tuple{"lora_b_diffusers.safetensors", 56, 112}}) {
        const auto f = sd::read_lora(lora(file), tiny());
        EXPECT_EQ(static_cast<int>(f.modules.size()), modules) << file;
        EXPECT_EQ(static_cast<int>(sd::read_weight_index(lora(file)).size()), tensors) << file;
        std::set<std::string> targets;
        for (const auto& m : f.modules) EXPECT_TRUE(targets.insert(m.stage + ":" + m.param).second) << m.key;
    }
}

// The README's CompVis names of kohya's diffusers module paths, with rank and alpha.
TEST(LoraKeys, KohyaModulesMapToCompVisNames) {
    const auto f = sd::read_lora(lora("lora_a.safetensors"), tiny());
    EXPECT_EQ(f.format, "kohya");
    const auto m = by_key(f);
    const std::map<std::string, std::string> want = {
        {"lora_unet_down_blocks_0_attentions_0_proj_in", "input_blocks.1.1.proj_in.weight"},
        {"lora_unet_down_blocks_0_attentions_1_transformer_blocks_0_attn2_to_out_0",
         "input_blocks.2.1.transformer_blocks.0.attn2.to_out.0.weight"},
        {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_ff_net_0_proj",
         "input_blocks.1.1.transformer_blocks.0.ff.net.0.proj.weight"},
        {"lora_unet_down_blocks_0_resnets_0_conv1", "input_blocks.1.0.in_layers.2.weight"},
        {"lora_unet_down_blocks_0_resnets_1_conv2", "input_blocks.2.0.out_layers.3.weight"},
        {"lora_unet_down_blocks_0_resnets_0_time_emb_proj", "input_blocks.1.0.emb_layers.1.weight"},
        {"lora_unet_down_blocks_0_downsamplers_0_conv", "input_blocks.3.0.op.weight"},
        {"lora_unet_down_blocks_1_resnets_0_conv_shortcut", "input_blocks.4.0.skip_connection.weight"},
        {"lora_unet_mid_block_resnets_1_conv1", "middle_block.2.in_layers.2.weight"},
        {"lora_unet_mid_block_attentions_0_proj_out", "middle_block.1.proj_out.weight"},
        {"lora_unet_up_blocks_0_resnets_2_conv_shortcut", "output_blocks.2.0.skip_connection.weight"},
        {"lora_unet_up_blocks_0_upsamplers_0_conv", "output_blocks.2.1.conv.weight"},
        {"lora_unet_up_blocks_1_attentions_2_transformer_blocks_0_attn1_to_k",
         "output_blocks.5.1.transformer_blocks.0.attn1.to_k.weight"},
        {"lora_unet_up_blocks_1_resnets_2_conv2", "output_blocks.5.0.out_layers.3.weight"},
        {"lora_te_text_model_encoder_layers_1_mlp_fc2", "text_model.encoder.layers.1.mlp.fc2.weight"}};
    for (const auto& [key, param] : want) {
        ASSERT_TRUE(m.count(key)) << key;
        EXPECT_EQ(m.at(key)->param, param) << key;
        EXPECT_EQ(m.at(key)->stage, key.rfind("lora_te_", 0) == 0 ? "text_encoder" : "unet") << key;
    }
    // Ranks and alphas of the README: attention 4/2, to_k 4/1, 3x3 LoCon 2/1, text 4/4.
    auto ra = [&](const std::string& k) { return std::pair{m.at(k)->rank, m.at(k)->alpha}; };
    EXPECT_EQ(ra("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"), (std::pair<int64_t, double>{4, 2}));
    EXPECT_EQ(ra("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k"), (std::pair<int64_t, double>{4, 1}));
    EXPECT_EQ(ra("lora_unet_down_blocks_0_resnets_0_conv1"), (std::pair<int64_t, double>{2, 1}));
    EXPECT_EQ(ra("lora_te_text_model_encoder_layers_0_self_attn_q_proj"), (std::pair<int64_t, double>{4, 4}));
    EXPECT_EQ(m.at("lora_unet_down_blocks_0_resnets_0_conv1")->part("down").shape, (std::vector<int64_t>{2, 32, 3, 3}));
}

// lora_b (kohya, no alpha) and lora_b_diffusers (diffusers' own format): the same targets, scale 1.
TEST(LoraKeys, DiffusersFileMapsLikeKohyaFileWithoutAlpha) {
    const auto k = sd::read_lora(lora("lora_b.safetensors"), tiny());
    const auto d = sd::read_lora(lora("lora_b_diffusers.safetensors"), tiny());
    EXPECT_EQ(d.format, "diffusers");
    std::set<std::string> kt, dt;
    for (const auto& m : k.modules) {
        kt.insert(m.stage + ":" + m.param);
        EXPECT_EQ(m.scale(), 1.0) << m.key;
    }
    for (const auto& m : d.modules) {
        dt.insert(m.stage + ":" + m.param);
        EXPECT_EQ(m.scale(), 1.0) << m.key;
        EXPECT_EQ(m.rank, 2) << m.key;
    }
    EXPECT_EQ(kt, dt);
    EXPECT_EQ(by_key(d).at("unet.up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_v")->param,
              "output_blocks.3.1.transformer_blocks.0.attn2.to_v.weight");
    EXPECT_EQ(by_key(d).at("text_encoder.text_model.encoder.layers.1.self_attn.out_proj")->param,
              "text_model.encoder.layers.1.self_attn.out_proj.weight");
}

// SD 1.5's sizes (4 levels): upsamplers after attentions sit at .2, the last level has no attention.
TEST(LoraKeys, DiffusersNamesOfFullSizeUnet) {
    const std::map<std::string, std::string> want = {
        {"time_embed.0", "time_embedding.linear_1"},
        {"input_blocks.0.0", "conv_in"},
        {"input_blocks.9.0.op", "down_blocks.2.downsamplers.0.conv"},
        {"input_blocks.10.0.in_layers.2", "down_blocks.3.resnets.0.conv1"},
        {"input_blocks.8.1.transformer_blocks.0.attn2.to_k", "down_blocks.2.attentions.1.transformer_blocks.0.attn2.to_k"},
        {"middle_block.1.proj_in", "mid_block.attentions.0.proj_in"},
        {"middle_block.0.emb_layers.1", "mid_block.resnets.0.time_emb_proj"},
        {"output_blocks.2.1.conv", "up_blocks.0.upsamplers.0.conv"},
        {"output_blocks.5.2.conv", "up_blocks.1.upsamplers.0.conv"},
        {"output_blocks.11.1.transformer_blocks.0.ff.net.2", "up_blocks.3.attentions.2.transformer_blocks.0.ff.net.2"},
        {"out.2", "conv_out"},
        {"input_blocks.1.0.in_layers.1", ""},  // SiLU: no weight, no module
        {"output_blocks.12.0.in_layers.2", "up_blocks.4.resnets.0.conv1"},
        {"nonsense", ""}};
    for (const auto& [compvis, diffusers] : want) EXPECT_EQ(sd::diffusers_unet_module(compvis), diffusers) << compvis;
}

TEST(LoraKeys, UnmatchedKeysAreNamedWithTheirCount) {
    auto t = module("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q", {2, 32}, {32, 2});
    for (const auto& k : {"lora_unet_down_blocks_7_attentions_0_proj_in", "lora_unet_nothing_here", "lora_te_foo_bar",
                          "lora_unet_up_blocks_9_resnets_0_conv1"}) {
        auto m = module(k, {2, 32}, {32, 2});
        t.insert(t.end(), m.begin(), m.end());
    }
    t.push_back({"some.other.tensor", "F32", {1}});
    const std::string e = refusal(safetensors(t));
    EXPECT_NE(e.find("has 5 keys that match no layer"), std::string::npos) << e;
    EXPECT_NE(e.find("lora_te_foo_bar"), std::string::npos) << e;
    EXPECT_NE(e.find("..."), std::string::npos) << e;
}

// A kohya LoRA made for tiny2 (SD 2.x: linear proj_in, 1024-style text widths) refused by the SD 1.x model.
TEST(LoraKeys, SD2LoraOnSD1ModelIsRefused) {
    const auto& two = tiny2();
    std::vector<int64_t> proj_in;
    for (const auto& w : two.unet)
        if (w.name == "input_blocks.1.1.proj_in.weight") proj_in = w.shape;
    ASSERT_EQ(proj_in.size(), 2u) << "tiny2's proj_in is linear";
    const auto t = module("lora_unet_down_blocks_0_attentions_0_proj_in", {4, proj_in[1]}, {proj_in[0], 4});
    // It fits tiny2 itself...
    EXPECT_EQ(sd::parse_lora(safetensors(t), "x.safetensors", two).modules.size(), 1u);
    // ...not tiny.
    const std::string e = refusal(safetensors(t));
    EXPECT_NE(e.find("linear layer there"), std::string::npos) << e;
    EXPECT_NE(e.find("1x1 conv"), std::string::npos) << e;
}

TEST(LoraKeys, OtherWidthsAreRefused) {
    const std::string e =
        refusal(safetensors(module("lora_te_text_model_encoder_layers_0_self_attn_q_proj", {4, 1024}, {1024, 4})));
    EXPECT_NE(e.find("does not fit this model"), std::string::npos) << e;
    EXPECT_NE(e.find("[32,32]"), std::string::npos) << e;
    // A 3x3 LoCon down on a 1x1 target.
    const std::string k = refusal(safetensors(module("lora_unet_down_blocks_0_attentions_0_proj_in", {2, 32, 3, 3}, {32, 2, 1, 1})));
    EXPECT_NE(k.find("does not fit"), std::string::npos) << k;
}

TEST(LoraKeys, OtherLayoutsAreRefusedByName) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"lora_te_text_model_transformer_resblocks_0_attn_out_proj", "open_clip"},
        {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj", "SDXL"},
        {"unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight", "PEFT"},
        {"lora_unet_down_blocks_0_resnets_0_conv1.hada_w1_a", "incomplete LoHa"},
        {"lora_unet_down_blocks_0_resnets_0_conv1.lokr_w1", "incomplete LoKr"},
        {"lora_unet_down_blocks_0_resnets_0_conv1.dora_scale", "dora_scale without a LoRA module"},
        {"lora_unet_down_blocks_0_resnets_0_conv1.wd_for_diff", "LyCORIS file of a kind"},
        {"lora_unet_down_blocks_0_resnets_0_conv1.oft_blocks", "LyCORIS file of a kind"}};
    for (const auto& [key, word] : cases) {
        const std::string e = refusal(safetensors({{key, "F32", {2, 32}}}));
        EXPECT_NE(e.find(word), std::string::npos) << e;
    }
}

TEST(LoraKeys, BrokenFilesAreRefused) {
    const std::string good = safetensors(module("lora_unet_down_blocks_0_attentions_0_proj_in", {2, 32, 1, 1}, {32, 2, 1, 1}));
    EXPECT_NE(refusal(good.substr(0, good.size() - 9)).find("corrupt"), std::string::npos);  // truncated
    EXPECT_NE(refusal("garbage").find("corrupt"), std::string::npos);
    EXPECT_NE(refusal(std::string(8, '\xff') + "{}").find("corrupt"), std::string::npos);  // huge header length
    EXPECT_NE(refusal(safetensors({})).find("no tensors"), std::string::npos);
    // An up without its down.
    const std::string lone = refusal(safetensors({{"lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight", "F32", {32, 2, 1, 1}}}));
    EXPECT_NE(lone.find("(no down)"), std::string::npos) << lone;
    // An alpha that is not one number.
    auto t = module("lora_unet_down_blocks_0_attentions_0_proj_in", {2, 32, 1, 1}, {32, 2, 1, 1});
    t.push_back({"lora_unet_down_blocks_0_attentions_0_proj_in.alpha", "F32", {2}});
    EXPECT_NE(refusal(safetensors(t)).find("alpha"), std::string::npos);
    EXPECT_THROW(sd::read_lora("/nonexistent/x.safetensors", tiny()), sd::Error);
}

// Alpha in fp16 / bf16 / fp32 is read as the number it holds (0x3c3c: fp16 1.0586, bf16 0.0115).
TEST(LoraKeys, AlphaOfEveryFloatType) {
    for (const auto& [dtype, want] : {std::pair{"F16", 1.05859375}, std::pair{"BF16", 0.011474609375}}) {
        auto t = module("lora_unet_down_blocks_0_attentions_0_proj_in", {2, 32, 1, 1}, {32, 2, 1, 1});
        t.push_back({"lora_unet_down_blocks_0_attentions_0_proj_in.alpha", dtype, {}});
        EXPECT_DOUBLE_EQ(sd::parse_lora(safetensors(t), "x", tiny()).modules[0].alpha, want) << dtype;
    }
}

TEST(LoraKeys, ShortHashIsSha256OfTheData) {
    sd::Sha256 h;
    h.update("abc", 3);
    EXPECT_EQ(h.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sd::Sha256 e;
    EXPECT_EQ(e.hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    // A file whose data is "abc" after its header.
    const std::string dir = sdtest::temp_dir();
    std::string file(8, '\0');
    file[0] = 2;
    sdtest::write_text(dir + "/a.safetensors", file + "{}abc");
    EXPECT_EQ(sd::lora_short_hash(dir + "/a.safetensors"), "ba7816bf8f01");
}

// The merge's memory: each changed parameter once in fp32 (stacked LoRAs do not count twice), plus the largest.
TEST(LoraKeys, FootprintCountsEachChangedParameterOnce) {
    const auto a = sd::read_lora(lora("lora_a.safetensors"), tiny());
    const auto b = sd::read_lora(lora("lora_b.safetensors"), tiny());
    double touched = 0, largest = 0;
    for (const auto& m : a.modules) {
        if (m.stage != "unet") continue;
        for (const auto& w : tiny().unet) {
            if (w.name != m.param) continue;
            double n = 4;
            for (auto d : w.shape) n *= static_cast<double>(d);
            touched += n;
            largest = std::max(largest, n);
        }
    }
    const auto fa = sd::lora_footprint({&a}, tiny().unet, "unet");
    EXPECT_DOUBLE_EQ(fa.touched, touched);
    EXPECT_DOUBLE_EQ(fa.largest, largest);
    EXPECT_DOUBLE_EQ(sd::lora_footprint({&a, &b}, tiny().unet, "unet").total(), fa.total());  // b's targets are a's
    EXPECT_GT(sd::lora_footprint({&b}, tiny().text_encoder, "text_encoder").touched, 0);
    EXPECT_LT(sd::lora_footprint({&b}, tiny().unet, "unet").touched, fa.touched);
}

// A LoRA is copied, not mapped: any offset is fine, but its tensors must be floats.
TEST(LoraKeys, UnalignedFloatsReadNonFloatsRefused) {
    auto t = module("lora_unet_down_blocks_0_attentions_0_proj_in", {2, 32, 1, 1}, {32, 2, 1, 1});
    t.insert(t.begin(), {"lora_unet_down_blocks_0_attentions_0_proj_in.alpha", "F16", {}});  // puts the F32 data at offset 2
    EXPECT_EQ(sd::parse_lora(safetensors(t), "x", tiny()).modules.size(), 1u);
    t[0].dtype = "I8";
    t[0].shape = {2};
    EXPECT_NE(refusal(safetensors(t)).find("not a float type"), std::string::npos);
}

// Issue 32's messages: a wrong-rank up names the shapes the target needs; a key
// holding a NUL or raw bytes is printed escaped, the whole line kept; an F64
// alpha is read as the number it holds.
TEST(LoraKeys, MismatchNamesTheExpectedShapes) {
    const std::string m = refusal(safetensors(
        module("lora_te_text_model_encoder_layers_0_self_attn_q_proj", {4, 32}, {128, 4, 1})));
    EXPECT_NE(m.find("up [128,4,1]"), std::string::npos) << m;
    EXPECT_NE(m.find("is a linear layer [32,32] here, which needs down [4,32] and up [32,4]"), std::string::npos) << m;
}

TEST(LoraKeys, KeysWithNulPrintEscaped) {
    const std::string m = refusal(safetensors(module(std::string("lora_unet_x\0y", 13), {4, 32}, {32, 4})));
    EXPECT_NE(m.find("lora_unet_x\\x00y"), std::string::npos) << m;
    EXPECT_NE(m.find("(a LoRA for another model"), std::string::npos) << m;  // the end of the line is still there
    EXPECT_EQ(m.find('\0'), std::string::npos);
}

TEST(LoraKeys, F64AlphaIsRead) {
    auto t = module("lora_unet_down_blocks_0_attentions_0_proj_in", {2, 32, 1, 1}, {32, 2, 1, 1});
    t.push_back({"lora_unet_down_blocks_0_attentions_0_proj_in.alpha", "F64", {}});
    double want;
    const uint64_t bits = 0x3c3c3c3c3c3c3c3cull;
    std::memcpy(&want, &bits, 8);
    EXPECT_DOUBLE_EQ(sd::parse_lora(safetensors(t), "x", tiny()).modules[0].alpha, want);
}

// read_lora opens the file once: header, alpha, hash, and later the tensors through the same reader.
TEST(LoraKeys, ReadLoraKeepsTheOpenFileAndItsHash) {
    const auto f = sd::read_lora(lora("lora_a.safetensors"), tiny());
    ASSERT_TRUE(f.file);
    EXPECT_EQ(f.hash, sd::lora_short_hash(lora("lora_a.safetensors")));
    EXPECT_EQ(f.hash.size(), 12u);
}

namespace {

const std::string kQ = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";  // [32, 32]
const std::string kC = "lora_unet_down_blocks_0_resnets_0_conv1";                                // [32, 32, 3, 3]

// Part names with their key prefix.
std::vector<T> parts(const std::string& module, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ps) {
    std::vector<T> out;
    for (const auto& [part, shape] : ps) out.push_back({module + "." + part, "F32", shape});
    return out;
}
std::vector<T> operator+(std::vector<T> a, const std::vector<T>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

}  // namespace

// LyCORIS's modules: LoHa (plain and with CP factors), LoKr (whole and product
// factors, a conv w2 and a matrix one) and LoCon's CP middle, with the rank alpha
// is divided by.
TEST(LoraKeys, LycorisModulesAreRead) {
    const float alpha_value = [] {  // the helper's data bytes, 0x3c3c3c3c
        float f;
        const uint32_t bits = 0x3c3c3c3c;
        std::memcpy(&f, &bits, 4);
        return f;
    }();
    const auto loha = sd::parse_lora(
        safetensors(parts(kQ, {{"alpha", {}}, {"hada_w1_a", {32, 4}}, {"hada_w1_b", {4, 32}}, {"hada_w2_a", {32, 2}},
                               {"hada_w2_b", {2, 32}}}) +
                    parts(kC, {{"hada_t1", {4, 4, 3, 3}}, {"hada_w1_a", {4, 32}}, {"hada_w1_b", {4, 32}},
                               {"hada_w2_a", {32, 2}}, {"hada_w2_b", {2, 288}}})),
        "x", tiny());
    auto m = by_key(loha);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m.at(kQ)->kind, sd::LoraKind::loha);
    EXPECT_EQ(m.at(kQ)->rank, 4);
    EXPECT_FLOAT_EQ(static_cast<float>(m.at(kQ)->scale()), alpha_value / 4);
    EXPECT_EQ(m.at(kC)->rank, 4);
    EXPECT_DOUBLE_EQ(m.at(kC)->scale(), 1.0);  // no alpha
    EXPECT_EQ(m.at(kC)->parts.size(), 5u);
    EXPECT_EQ(m.at(kC)->param, "input_blocks.1.0.in_layers.2.weight");

    const auto lokr = sd::parse_lora(
        safetensors(parts(kQ, {{"alpha", {}}, {"lokr_w1", {4, 4}}, {"lokr_w2_a", {8, 2}}, {"lokr_w2_b", {2, 8}}}) +
                    parts(kC, {{"alpha", {}}, {"lokr_w1_a", {4, 1}}, {"lokr_w1_b", {1, 2}}, {"lokr_w2", {8, 16, 3, 3}}}) +
                    parts("lora_unet_down_blocks_0_resnets_0_conv2",
                          {{"alpha", {}}, {"lokr_w1", {2, 2}}, {"lokr_t2", {2, 2, 3, 3}}, {"lokr_w2_a", {2, 16}},
                           {"lokr_w2_b", {2, 16}}}) +
                    parts("lora_unet_down_blocks_0_attentions_0_proj_in", {{"alpha", {}}, {"lokr_w1", {4, 4}}, {"lokr_w2", {8, 8}}}) +
                    parts("lora_unet_down_blocks_0_attentions_0_proj_out",
                          {{"lokr_w1_a", {4, 3}}, {"lokr_w1_b", {3, 4}}, {"lokr_w2_a", {8, 5}}, {"lokr_w2_b", {5, 8}}})),
        "x", tiny());
    m = by_key(lokr);
    ASSERT_EQ(m.size(), 5u);
    EXPECT_EQ(m.at(kQ)->kind, sd::LoraKind::lokr);
    EXPECT_EQ(m.at("lora_unet_down_blocks_0_attentions_0_proj_out")->rank, 5);  // w2_b's over w1_b's, as A1111
    EXPECT_EQ(m.at(kQ)->rank, 2);  // w2_b's
    EXPECT_EQ(m.at(kC)->rank, 1);  // w1_b's, with a whole w2
    EXPECT_EQ(m.at("lora_unet_down_blocks_0_resnets_0_conv2")->rank, 2);
    EXPECT_EQ(m.at("lora_unet_down_blocks_0_attentions_0_proj_in")->rank, 0);
    EXPECT_DOUBLE_EQ(m.at("lora_unet_down_blocks_0_attentions_0_proj_in")->scale(), 1.0);  // alpha unused, as A1111

    const auto mid = sd::parse_lora(
        safetensors(parts(kC, {{"lora_down.weight", {2, 32, 1, 1}}, {"lora_mid.weight", {2, 2, 3, 3}}, {"lora_up.weight", {32, 2, 1, 1}}})),
        "x", tiny());
    ASSERT_EQ(mid.modules.size(), 1u);
    EXPECT_EQ(mid.modules[0].kind, sd::LoraKind::lora);
    EXPECT_TRUE(mid.modules[0].has("mid"));
    EXPECT_EQ(mid.modules[0].rank, 2);
}

// Each way a LyCORIS module can miss its target is refused with one line naming the key and the shapes.
TEST(LoraKeys, LycorisModulesThatDoNotFitAreRefused) {
    const std::vector<std::vector<T>> bad = {
        parts(kQ, {{"hada_w1_a", {32, 4}}, {"hada_w1_b", {4, 32}}, {"hada_w2_a", {32, 2}}, {"hada_w2_b", {2, 16}}}),
        parts(kQ, {{"hada_w1_a", {32, 4}}, {"hada_w1_b", {2, 32}}, {"hada_w2_a", {32, 2}}, {"hada_w2_b", {2, 32}}}),
        parts(kC, {{"hada_t1", {4, 4, 3, 3}}, {"hada_w1_a", {4, 32}}, {"hada_w1_b", {4, 32}}, {"hada_w2_a", {32, 2}},
                   {"hada_w2_b", {2, 32}}}),
        parts(kC, {{"hada_t1", {4, 4, 1, 1}}, {"hada_w1_a", {4, 32}}, {"hada_w1_b", {4, 32}}, {"hada_t2", {4, 4, 1, 1}},
                   {"hada_w2_a", {4, 32}}, {"hada_w2_b", {4, 32}}}),
        parts(kQ, {{"lokr_w1", {4, 4}}, {"lokr_w2_a", {8, 2}}, {"lokr_w2_b", {2, 4}}}),
        parts(kQ, {{"lokr_w1", {4, 4}}, {"lokr_w2", {8, 8, 1, 1}}}),
        parts(kC, {{"lokr_w1", {4, 4}}, {"lokr_w2", {8, 8, 1, 1}}}),
        parts(kC, {{"lora_down.weight", {2, 32, 3, 3}}, {"lora_mid.weight", {2, 2, 3, 3}}, {"lora_up.weight", {32, 2, 1, 1}}}),
        parts(kC, {{"lora_down.weight", {2, 32, 1, 1}}, {"lora_mid.weight", {4, 2, 3, 3}}, {"lora_up.weight", {32, 2, 1, 1}}}),
    };
    for (const auto& t : bad) {
        const std::string e = refusal(safetensors(t));
        EXPECT_NE(e.find("does not fit this model"), std::string::npos) << e;
        EXPECT_NE(e.find(t[0].name.substr(0, t[0].name.find('.'))), std::string::npos) << e;
    }
    // Incomplete or mixed sets name the module among the keys that match nothing.
    for (const auto& t : {parts(kQ, {{"hada_w1_a", {32, 4}}, {"hada_w1_b", {4, 32}}, {"hada_w2_a", {32, 2}}}),
                          parts(kQ, {{"lokr_w1", {4, 4}}, {"lokr_w1_a", {4, 1}}, {"lokr_w1_b", {1, 4}}, {"lokr_w2", {8, 8}}}),
                          parts(kQ, {{"lokr_w1", {4, 4}}, {"lokr_t2", {2, 2, 1, 1}}, {"lokr_w2", {8, 8}}}),
                          parts(kQ, {{"lora_down.weight", {2, 32}}, {"lora_up.weight", {32, 2}}, {"hada_w1_a", {32, 2}}})}) {
        const std::string e = refusal(safetensors(t));
        EXPECT_NE(e.find("match no layer"), std::string::npos) << e;
    }
    // A part that is not a matrix, and an empty one.
    EXPECT_NE(refusal(safetensors(parts(kQ, {{"lokr_w1", {16}}, {"lokr_w2", {8, 8}}}))).find("not a matrix"), std::string::npos);
    EXPECT_NE(refusal(safetensors(parts(kQ, {{"lokr_w1", {4, 0}}, {"lokr_w2", {8, 8}}}))).find("empty"), std::string::npos);
}

// A DoRA magnitude rides on any kind, one per output row or one per input column, with
// the weight's dims; any other shape is refused naming both shapes it could have had.
TEST(LoraKeys, DoraMagnitudesAreReadAlongTheirAxis) {
    const auto file = sd::parse_lora(
        safetensors(parts(kQ, {{"alpha", {}}, {"lora_down.weight", {4, 32}}, {"lora_up.weight", {32, 4}}, {"dora_scale", {1, 32}}}) +
                    parts(kC, {{"hada_w1_a", {32, 2}}, {"hada_w1_b", {2, 288}}, {"hada_w2_a", {32, 2}},
                               {"hada_w2_b", {2, 288}}, {"dora_scale", {32, 1, 1, 1}}}) +
                    parts("lora_unet_down_blocks_0_attentions_0_proj_in",
                          {{"lokr_w1", {4, 4}}, {"lokr_w2", {8, 8}}, {"dora_scale", {32, 1, 1, 1}}})),
        "x", tiny());
    const auto m = by_key(file);
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m.at(kQ)->kind, sd::LoraKind::lora);
    EXPECT_TRUE(m.at(kQ)->has("dora_scale"));
    EXPECT_EQ(m.at(kQ)->rank, 4);
    EXPECT_EQ(m.at(kC)->kind, sd::LoraKind::loha);
    EXPECT_EQ(m.at("lora_unet_down_blocks_0_attentions_0_proj_in")->kind, sd::LoraKind::lokr);

    EXPECT_EQ(sd::dora_axis({32, 1}, {32, 16}), 0);
    EXPECT_EQ(sd::dora_axis({1, 16}, {32, 16}), 1);
    EXPECT_EQ(sd::dora_axis({1, 16, 1, 1}, {32, 16, 3, 3}), 1);
    EXPECT_EQ(sd::dora_axis({32, 1, 1, 1}, {32, 16, 3, 3}), 0);
    for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{{16, 1}, {1, 32}, {32}, {32, 16}, {32, 1, 1}, {1, 1}})
        EXPECT_EQ(sd::dora_axis(bad, {32, 16}), -1) << bad.size();
    EXPECT_EQ(sd::dora_axis({32, 1}, {32, 16, 1, 1}), -1);  // a conv's magnitude has the conv's dims

    for (const auto& t : {parts(kQ, {{"lora_down.weight", {4, 32}}, {"lora_up.weight", {32, 4}}, {"dora_scale", {32, 32}}}),
                          parts(kC, {{"lora_down.weight", {2, 32, 3, 3}}, {"lora_up.weight", {32, 2, 1, 1}}, {"dora_scale", {1, 32}}})}) {
        const std::string e = refusal(safetensors(t));
        EXPECT_NE(e.find("DoRA magnitude dora_scale"), std::string::npos) << e;
        EXPECT_NE(e.find("per output"), std::string::npos) << e;
    }
    const std::string lone = refusal(safetensors(parts(kQ, {{"alpha", {}}, {"dora_scale", {1, 32}}})));
    EXPECT_NE(lone.find("dora_scale without a LoRA module"), std::string::npos) << lone;
    const std::string flat = refusal(safetensors(parts(kQ, {{"lora_down.weight", {4, 32}}, {"lora_up.weight", {32, 4}}, {"dora_scale", {32}}})));
    EXPECT_NE(flat.find("not a matrix"), std::string::npos) << flat;
}

// A LoHa's second product goes into the first a row chunk at a time: one whole-size factor
// and a chunk; with a CP second factor both whole-size factors count.
TEST(LoraKeys, FootprintCountsLohaFactors) {
    const auto loha = sd::parse_lora(
        safetensors(parts(kQ, {{"hada_w1_a", {32, 4}}, {"hada_w1_b", {4, 32}}, {"hada_w2_a", {32, 2}}, {"hada_w2_b", {2, 32}}})),
        "x", tiny());
    const auto cp = sd::parse_lora(safetensors(parts(kC, {{"hada_w1_a", {32, 2}}, {"hada_w1_b", {2, 288}}, {"hada_t2", {2, 2, 3, 3}},
                                                          {"hada_w2_a", {2, 32}}, {"hada_w2_b", {2, 32}}})),
                                   "x", tiny());
    const auto lora = sd::parse_lora(safetensors(module(kQ, {4, 32}, {32, 4})), "x", tiny());
    const auto fl = sd::lora_footprint({&lora}, tiny().unet, "unet"), fh = sd::lora_footprint({&loha}, tiny().unet, "unet");
    EXPECT_DOUBLE_EQ(fl.touched, 32 * 32 * 4);
    EXPECT_DOUBLE_EQ(fh.touched, fl.touched);
    EXPECT_DOUBLE_EQ(fh.largest, fl.largest + sd::kLohaRowChunkBytes);
    EXPECT_DOUBLE_EQ(sd::lora_footprint({&lora, &loha}, tiny().unet, "unet").largest, fh.largest);  // stacked after a LoRA too
    EXPECT_DOUBLE_EQ(sd::lora_footprint({&cp}, tiny().unet, "unet").largest, 2 * 32 * 32 * 9 * 4);
}
