// LoRA through the tool: bad LoRA files and tags (one line, non-zero exit,
// before the model loads), the PNG text and --from-png, and a prompt file
// whose lines name different LoRA sets.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/image_io.h"
#include "test_util.h"

namespace {

void expect_clean_failure(const sdtest::CmdResult& r, const std::string& must_mention) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << "stderr:\n" << r.err;
    EXPECT_NE(r.err.find(must_mention), std::string::npos) << "stderr should mention '" << must_mention << "':\n" << r.err;
    for (const char* bad : {"terminate called", "Traceback", "Exception raised from", "Segmentation"})
        EXPECT_EQ(r.err.find(bad), std::string::npos) << r.err;
}

std::vector<std::string> args(const std::string& outdir, std::vector<std::string> more) {
    std::vector<std::string> v = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", outdir, "--quiet",
                                  "--threads", "1", "--H", "64", "--W", "64", "--steps", "2", "--sampler", "ddim"};
    v.insert(v.end(), more.begin(), more.end());
    return v;
}

std::string fixture_lora(const std::string& name) { return sdtest::fixtures() + "/lora/" + name; }

// A kohya LoRA of one module, fp16, data all zero.
std::string write_lora(const std::string& path, const std::string& key, std::vector<int64_t> down, std::vector<int64_t> up) {
    nlohmann::json h;
    int64_t d = 2, u = 2;
    for (auto x : down) d *= x;
    for (auto x : up) u *= x;
    h[key + ".lora_down.weight"] = {{"dtype", "F16"}, {"shape", down}, {"data_offsets", {0, d}}};
    h[key + ".lora_up.weight"] = {{"dtype", "F16"}, {"shape", up}, {"data_offsets", {d, d + u}}};
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    sdtest::write_text(path, len + text + std::string(static_cast<size_t>(d + u), '\0'));
    return path;
}

}  // namespace

// Keys that match no layer: two of lora_b's keys renamed (the header stays valid).
TEST(LoraBadInput, UnmatchedKeys) {
    std::string bytes = sdtest::read_text(fixture_lora("lora_b.safetensors"));
    const std::string from = "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down";
    const auto at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), "lora_te_text_model_encoder_layers_0_self_attn_x_proj.lora_down");
    const std::string dir = sdtest::temp_dir(), path = dir + "/renamed.safetensors";
    sdtest::write_text(path, bytes);
    auto r = sdtest::run(args(dir, {"--prompt", "a cat", "--lora", path}));
    expect_clean_failure(r, "renamed.safetensors");
    EXPECT_NE(r.err.find("2 keys that match no layer"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("x_proj"), std::string::npos) << r.err;
}

// A LoRA made from the tiny SD 2.x model's shapes (its proj_in is linear) on the SD 1.x model.
TEST(LoraBadInput, SD2LoraOnSD1Model) {
    const std::string ckpt = sdtest::read_text(sdtest::fixtures() + "/tiny2/tiny2.safetensors");
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = len << 8 | static_cast<unsigned char>(ckpt[i]);
    const auto header = nlohmann::json::parse(ckpt.substr(8, len));
    const auto shape = header.at("model.diffusion_model.input_blocks.1.1.proj_in.weight").at("shape").get<std::vector<int64_t>>();
    ASSERT_EQ(shape.size(), 2u);
    const std::string dir = sdtest::temp_dir();
    const auto path = write_lora(dir + "/sd2.safetensors", "lora_unet_down_blocks_0_attentions_0_proj_in", {4, shape[1]}, {shape[0], 4});
    auto r = sdtest::run(args(dir, {"--prompt", "a cat", "--lora", path}));
    expect_clean_failure(r, "sd2.safetensors");
    EXPECT_NE(r.err.find("does not fit this model"), std::string::npos) << r.err;
}

// --plan counts the LoRAs the run would merge, as the run does: it reads them (a LoRA for
// another model is refused as the run refuses it), and a plan with one is no smaller.
TEST(LoraBadInput, PlanReadsTheRunsLoras) {
    const std::string dir = sdtest::temp_dir();
    const auto path = write_lora(dir + "/wide.safetensors", "lora_unet_down_blocks_0_attentions_0_proj_in", {4, 64, 1, 1}, {64, 4, 1, 1});
    expect_clean_failure(sdtest::run(args(dir, {"--prompt", "a cat", "--lora", path, "--plan"})), "wide.safetensors");
    expect_clean_failure(sdtest::run(args(dir, {"--prompt", "a cat <lora:wide:1>", "--lora-dir", dir, "--plan"})), "wide.safetensors");
    const auto peak = [&](std::vector<std::string> more) {
        more.insert(more.end(), {"--prompt", "a cat", "--plan", "--weights", "fp16"});
        const auto r = sdtest::run(args(dir, more));
        EXPECT_EQ(r.exit_code, 0) << r.err;
        const auto at = r.out.find("predicted peak: ");
        EXPECT_NE(at, std::string::npos) << r.out;
        return at == std::string::npos ? 0.0 : std::stod(r.out.substr(at + 16));
    };
    EXPECT_GE(peak({"--lora", fixture_lora("lora_a.safetensors")}), peak({}));
}

// An extra network this tool does not apply (<hypernet:...>) leaves the text as in A1111, so
// the picture is the prompt's without it, and the user is told once, even with --quiet.
TEST(LoraBadInput, OtherExtraNetworkTagsAreLeftOutWithAWarning) {
    const std::string dir = sdtest::temp_dir();
    auto tagged = sdtest::run(args(dir + "/t", {"--prompt", "a cat <hypernet:ink:0.8>", "--n_samples", "2",
                                                "--save-latents", dir + "/tagged.npy"}));
    ASSERT_EQ(tagged.exit_code, 0) << tagged.err;
    EXPECT_EQ(sdtest::lines(tagged.err).size(), 1u) << tagged.err;
    EXPECT_NE(tagged.err.find("--prompt: <hypernet:ink:0.8> is an A1111 extra network that this tool does not apply"),
              std::string::npos)
        << tagged.err;
    auto plain = sdtest::run(args(dir + "/p", {"--prompt", "a cat", "--n_samples", "2", "--save-latents", dir + "/plain.npy"}));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_TRUE(plain.err.empty()) << plain.err;
    EXPECT_EQ(sdtest::read_text(dir + "/tagged.npy"), sdtest::read_text(dir + "/plain.npy"));
    // With the plain prompt syntax the tag is text like any other: a different picture, no warning.
    auto text = sdtest::run(args(dir + "/x", {"--prompt", "a cat <hypernet:ink:0.8>", "--n_samples", "2",
                                              "--prompt-syntax", "plain", "--save-latents", dir + "/text.npy"}));
    ASSERT_EQ(text.exit_code, 0) << text.err;
    EXPECT_TRUE(text.err.empty()) << text.err;
    EXPECT_NE(sdtest::read_text(dir + "/text.npy"), sdtest::read_text(dir + "/plain.npy"));
}

// Prompt editing, alternation and AND are applied (PromptEditing.*, ComposedPrompts.* in
// test_conditioning.cpp): nothing to warn about.
TEST(LoraBadInput, A1111PromptSyntaxRunsWithoutWarnings) {
    const std::string dir = sdtest::temp_dir();
    auto edited = sdtest::run(args(dir + "/e", {"--prompt", "a [cat:dog:0.5] [red|blue] AND a fox:0.7",
                                                "--negative-prompt", "[blurry::2] [cat:dog:0.5] AND rain"}));
    ASSERT_EQ(edited.exit_code, 0) << edited.err;
    EXPECT_TRUE(edited.err.empty()) << edited.err;
}

TEST(LoraBadInput, MissingFileNamedInPromptTag) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(args(dir, {"--prompt", "a cat <lora:nothere:0.7>", "--lora-dir", fixture_lora("")}));
    expect_clean_failure(r, "nothere.safetensors");
    EXPECT_NE(r.err.find("<lora:nothere>"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir + "/00000.png"));
}

TEST(LoraBadInput, TruncatedFile) {
    const std::string dir = sdtest::temp_dir(), path = dir + "/cut.safetensors";
    const std::string bytes = sdtest::read_text(fixture_lora("lora_a.safetensors"));
    sdtest::write_text(path, bytes.substr(0, bytes.size() / 2));
    expect_clean_failure(sdtest::run(args(dir, {"--prompt", "a cat", "--lora", path})), "cut.safetensors");
    sdtest::write_text(path, bytes.substr(0, 20));  // cut inside the header
    expect_clean_failure(sdtest::run(args(dir, {"--prompt", "a cat", "--lora", path})), "cut.safetensors");
    expect_clean_failure(sdtest::run(args(dir, {"--prompt", "a cat", "--lora", dir + "/none.safetensors"})), "none.safetensors");
}

// The PNG text keeps the tags (--lora's file written as one) and A1111's "Lora hashes";
// --from-png with --lora-dir makes the same image again.
TEST(LoraPng, FromPngRerunsTheLoras) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(args(dir + "/a", {"--prompt", "a cat <lora:lora_a:0.6>", "--lora-dir", fixture_lora(""), "--lora",
                                           fixture_lora("lora_b.safetensors") + ":0.8"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string png = sdtest::lines(r.out).at(0);
    const std::string text = sdtest::read_text(png);
    EXPECT_NE(text.find("a cat <lora:lora_a:0.6> <lora:lora_b:0.8>\n"), std::string::npos);
    EXPECT_NE(text.find("Lora hashes: \"lora_a: "), std::string::npos);
    EXPECT_NE(text.find(", lora_b: "), std::string::npos);
    auto again = sdtest::run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", dir + "/b", "--quiet",
                              "--threads", "1", "--from-png", png, "--lora-dir", fixture_lora("")});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(sd::read_png(sdtest::lines(again.out).at(0)).rgb, sd::read_png(png).rgb);
    // Without the LoRAs the image differs: the test can fail.
    auto plain = sdtest::run(args(dir + "/c", {"--prompt", "a cat"}));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NE(sd::read_png(sdtest::lines(plain.out).at(0)).rgb, sd::read_png(png).rgb);
}

// Lines naming different LoRA sets run in separate batches, the stages reloaded for each set:
// every image equals the one its line makes alone.
TEST(LoraBatch, LinesWithDifferentLorasEachGetTheirOwn) {
    const std::string dir = sdtest::temp_dir();
    const std::string file = dir + "/p.txt";
    sdtest::write_text(file, "a cat <lora:lora_b:1>\na cat\na cat <lora:lora_a:0.5>\n");
    auto r = sdtest::run(args(dir + "/all", {"--from-file", file, "--lora-dir", fixture_lora(""), "--seed-mode", "per-image",
                                             "--n_samples", "3"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto pngs = sdtest::lines(r.out);
    ASSERT_EQ(pngs.size(), 3u);
    const std::vector<std::string> prompts = {"a cat <lora:lora_b:1>", "a cat", "a cat <lora:lora_a:0.5>"};
    for (int i = 0; i < 3; ++i) {
        auto one = sdtest::run(args(dir + "/one" + std::to_string(i), {"--prompt", prompts[i], "--lora-dir", fixture_lora(""),
                                                                      "--seed", std::to_string(42 + i)}));
        ASSERT_EQ(one.exit_code, 0) << one.err;
        EXPECT_EQ(sd::read_png(sdtest::lines(one.out).at(0)).rgb, sd::read_png(pngs[i]).rgb) << prompts[i];
    }
}
