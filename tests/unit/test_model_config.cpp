// model.json (sd/model_config.h): the checks fuzzing added; the rest of its
// rules are exercised through the tool in tests/cli/test_cli.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "sd/model_config.h"
#include "test_util.h"

namespace {

nlohmann::json minimal() {
    return {{"format", 1}, {"scale_factor", 0.18215}, {"latent_channels", 4}, {"downsample_factor", 8},
            {"size_multiple", 64}, {"context_length", 77}, {"alphas_cumprod", {0.99, 0.5}}};
}

std::string error_of(const std::string& text) {
    try {
        sd::parse_model_config(text, "m");
    } catch (const sd::Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(ModelConfig, MinimalFileParsesWithDefaults) {
    const auto c = sd::parse_model_config(minimal().dump(), "m");
    EXPECT_EQ(c.context_length, 77);
    EXPECT_EQ(c.family, "sd1");
    EXPECT_EQ(c.unet_path, "m/unet.pt");
    ASSERT_EQ(c.alphas_cumprod.size(), 2u);
}

TEST(ModelConfig, FusedAttentionFlagIsABoolean) {
    EXPECT_FALSE(sd::parse_model_config(minimal().dump(), "m").fused_attention) << "older exports lack the key";
    auto j = minimal();
    j["fused_attention"] = true;
    EXPECT_TRUE(sd::parse_model_config(j.dump(), "m").fused_attention);
    j["fused_attention"] = "yes";
    EXPECT_NE(error_of(j.dump()).find("fused_attention"), std::string::npos);
}

// Nesting past 64 levels is refused while parsing: printing or walking such a
// value (the "got ..." of an error, the architecture check) recursed once per
// level, and 100000 levels overflowed the stack.
TEST(ModelConfig, DeepNestingIsRefusedInOneLine) {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    for (const char* key : {"source", "architecture", "alphas_cumprod"}) {
        auto j = minimal().dump();
        j.insert(j.size() - 1, std::string(",\"") + key + "\":" + deep);
        EXPECT_EQ(error_of(j), "m/model.json: invalid model.json (nested more than 64 levels deep)") << key;
    }
    // 64 levels (the file's object and 63 arrays) still parse: the usual error follows.
    auto j = minimal().dump();
    j.insert(j.size() - 1, ",\"source\":" + std::string(63, '[') + std::string(63, ']'));
    EXPECT_NE(error_of(j).find("\"source\" must be a string"), std::string::npos) << error_of(j);
}

// An alphas_cumprod entry is kept as a float: 1e-50 is above 0 as a double but
// 0 as a float (an infinite noise level), so it is refused like 0.
TEST(ModelConfig, AlphaWhoseFloatIsZeroIsRefused) {
    auto j = minimal();
    j["alphas_cumprod"] = {0.99, 1e-50};
    EXPECT_EQ(error_of(j.dump()), "m/model.json: \"alphas_cumprod\" holds 1e-50; every entry must be in (0, 1]");
    j["alphas_cumprod"] = {0.99, 1e-40};  // a float denormal, above 0: still accepted
    EXPECT_EQ(error_of(j.dump()), "");
}

// load_model_config reads the file and then checks that the files it names
// exist; the rules in between are parse_model_config's.
TEST(ModelConfig, LoadAddsOnlyTheFileChecks) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/model.json", minimal().dump());
    try {
        sd::load_model_config(dir);
        FAIL() << "accepted without its files";
    } catch (const sd::Error& e) {
        EXPECT_EQ(std::string(e.what()), "model file " + dir + "/text_encoder.pt is missing");
    }
    for (const char* f : {"text_encoder.pt", "unet.pt", "vae_decoder.pt", "vocab.json", "merges.txt"})
        sdtest::write_text(dir + "/" + f, "");
    EXPECT_EQ(sd::load_model_config(dir).unet_path, dir + "/unet.pt");
}

// The files model.json names stay inside the model folder (issue 16): no
// path, no parent, no empty name.
TEST(ModelConfig, FileNamesStayInsideTheFolder) {
    for (const char* name : {"../unet.pt", "/etc/passwd", "sub/unet.pt", "..", ".", ""}) {
        auto j = minimal();
        j["files"] = {{"unet", name}};
        EXPECT_EQ(error_of(j.dump()), std::string("m/model.json: files.unet must be a file name inside the model "
                                                  "folder, got \"") + name + "\"") << name;
    }
    auto j = minimal();
    j["files"] = {{"unet", "my unet.pt"}};
    EXPECT_EQ(sd::parse_model_config(j.dump(), "m").unet_path, "m/my unet.pt");
}

// SDXL's "sdxl" object: read, and its widths checked against each other.
TEST(ModelConfig, SdxlFieldsAreReadAndChecked) {
    auto j = minimal();
    j["family"] = "sdxl";
    j["context_dim"] = 80;
    EXPECT_NE(error_of(j.dump()).find("needs the \"sdxl\" object"), std::string::npos) << error_of(j.dump());
    j["sdxl"] = {{"text_encoder_width", 32}, {"text_encoder_2_width", 48}, {"text_encoder_2_pad_id", 0},
                 {"pooled_dim", 48},         {"size_embedding_dim", 256},  {"adm_in_channels", 1584}};
    const auto c = sd::parse_model_config(j.dump(), "m");
    EXPECT_TRUE(c.is_sdxl());
    EXPECT_EQ(c.sdxl.adm_in_channels, 1584);
    EXPECT_EQ(c.text_encoder_2_path, "m/text_encoder_2.pt");
    auto bad = j;
    bad["sdxl"]["adm_in_channels"] = 2816;
    EXPECT_NE(error_of(bad.dump()).find("adm_in_channels must be pooled_dim + 6 * size_embedding_dim"), std::string::npos);
    bad = j;
    bad["sdxl"]["text_encoder_2_width"] = 1280;
    EXPECT_NE(error_of(bad.dump()).find("must equal context_dim"), std::string::npos);
    bad = j;
    bad["sdxl"].erase("pooled_dim");
    EXPECT_NE(error_of(bad.dump()).find("\"pooled_dim\" is missing"), std::string::npos) << error_of(bad.dump());
    EXPECT_TRUE(sd::parse_model_config(minimal().dump(), "m").text_encoder_2_path.empty());
}

// "unet_in_channels": the latents alone, or an inpainting UNet's latents, mask and
// masked-picture latents; absent in folders exported before it (text to image).
TEST(ModelConfig, UnetInputChannelsAreTheLatentsOrTheInpaintingLayout) {
    const auto plain = sd::parse_model_config(minimal().dump(), "m");
    EXPECT_EQ(plain.unet_in_channels, 4) << "older exports lack the key";
    EXPECT_FALSE(plain.is_inpainting());
    auto j = minimal();
    j["unet_in_channels"] = 9;
    const auto inpaint = sd::parse_model_config(j.dump(), "m");
    EXPECT_EQ(inpaint.unet_in_channels, 9);
    EXPECT_TRUE(inpaint.is_inpainting());
    j["unet_in_channels"] = 4;
    EXPECT_FALSE(sd::parse_model_config(j.dump(), "m").is_inpainting());
    for (int bad : {5, 8, 0}) {
        j["unet_in_channels"] = bad;
        EXPECT_NE(error_of(j.dump()).find("\"unet_in_channels\""), std::string::npos)
            << bad << ": " << error_of(j.dump());
    }
    j["unet_in_channels"] = 5;
    EXPECT_EQ(error_of(j.dump()), "m/model.json: \"unet_in_channels\" must be 4 (text to image) or 9 (inpainting: "
                                  "latents, mask, masked-picture latents), got 5");
    j["unet_in_channels"] = "9";
    EXPECT_NE(error_of(j.dump()).find("must be a whole number"), std::string::npos) << error_of(j.dump());
}

// "files.vae_encoder": the encoder stage, a name inside the folder like the other
// stages, checked to exist when named; a folder without it (exported before it)
// still loads, with no encoder.
TEST(ModelConfig, VaeEncoderIsOptionalAndCheckedWhenNamed) {
    EXPECT_TRUE(sd::parse_model_config(minimal().dump(), "m").vae_encoder_path.empty());
    auto j = minimal();
    j["files"] = {{"vae_encoder", "vae_encoder.pt"}};
    EXPECT_EQ(sd::parse_model_config(j.dump(), "m").vae_encoder_path, "m/vae_encoder.pt");
    j["files"] = {{"vae_encoder", "../vae_encoder.pt"}};
    EXPECT_EQ(error_of(j.dump()), "m/model.json: files.vae_encoder must be a file name inside the model folder, "
                                  "got \"../vae_encoder.pt\"");
    j["files"] = {{"vae_encoder", 7}};
    EXPECT_NE(error_of(j.dump()).find("must be a string"), std::string::npos) << error_of(j.dump());

    const std::string dir = sdtest::temp_dir();
    for (const char* f : {"text_encoder.pt", "unet.pt", "vae_decoder.pt", "vocab.json", "merges.txt"})
        sdtest::write_text(dir + "/" + f, "");
    sdtest::write_text(dir + "/model.json", minimal().dump());
    EXPECT_TRUE(sd::load_model_config(dir).vae_encoder_path.empty()) << "txt2img folders load without it";
    j = minimal();
    j["files"] = {{"vae_encoder", "vae_encoder.pt"}};
    sdtest::write_text(dir + "/model.json", j.dump());
    try {
        sd::load_model_config(dir);
        FAIL() << "accepted without the encoder it names";
    } catch (const sd::Error& e) {
        EXPECT_EQ(std::string(e.what()), "model file " + dir + "/vae_encoder.pt is missing");
    }
    sdtest::write_text(dir + "/vae_encoder.pt", "");
    EXPECT_EQ(sd::load_model_config(dir).vae_encoder_path, dir + "/vae_encoder.pt");
}

// source_sha256: the checkpoint's SHA-256 (the PNG's Model hash), optional, and
// nothing but 64 lower-case hex digits (it ends up in the PNG text).
TEST(ModelConfig, SourceSha256IsOptionalAnd64HexDigits) {
    EXPECT_EQ(sd::parse_model_config(minimal().dump(), "m").source_sha256, "") << "older exports lack the key";
    auto j = minimal();
    const std::string sha(64, 'a');
    j["source_sha256"] = sha;
    EXPECT_EQ(sd::parse_model_config(j.dump(), "m").source_sha256, sha);
    for (const std::string bad : {std::string(63, 'a'), std::string(64, 'A'), std::string(63, 'a') + ",",
                                  std::string(63, 'a') + "\n"}) {
        j["source_sha256"] = bad;
        EXPECT_EQ(error_of(j.dump()), "m/model.json: \"source_sha256\" must be 64 lower-case hex digits") << bad;
    }
    j["source_sha256"] = 5;
    EXPECT_NE(error_of(j.dump()).find("source_sha256"), std::string::npos);
}
