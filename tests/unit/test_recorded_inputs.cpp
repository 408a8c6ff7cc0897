// Issue 32, run side: what --from-png reads from a PNG's text, --lora names
// that a tag cannot carry, the shard cap and --manifest's path, each refused
// with one line naming the file.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>

#include "run/batch_plan.h"
#include "sd/error.h"
#include "sd/from_png.h"
#include "sd/model_hash.h"
#include "sd/txt2img.h"
#include "test_util.h"
#include "sd/loras.h"

namespace {

const std::string kSettings = "Steps: 2, Sampler: DDIM, CFG scale: 7.5, Seed: 1, Size: 64x64, Model: m";

using sdtest::error_of;

}  // namespace

// The prompt and negative prompt of a PNG follow --prompt's rules, and the message names the PNG.
TEST(RecordedText, PromptRulesApplyAndNameThePng) {
    const std::string long_prompt(20000, 'a');
    std::string m = error_of([&] { sd::parse_parameters_text(long_prompt + "\n" + kSettings, "x.png"); });
    EXPECT_NE(m.find("x.png: the prompt is 20000 bytes long; the limit is 16384"), std::string::npos) << m;
    m = error_of([&] { sd::parse_parameters_text(std::string("a\0b", 3) + "\n" + kSettings, "y.png"); });
    EXPECT_NE(m.find("y.png: the prompt contains a NUL"), std::string::npos) << m;
    m = error_of([&] { sd::parse_parameters_text("a\nNegative prompt: caf\xe9\n" + kSettings, "z.png"); });
    EXPECT_NE(m.find("z.png: the negative prompt is not valid UTF-8"), std::string::npos) << m;
    EXPECT_NO_THROW(sd::parse_parameters_text(std::string(16384, 'a') + "\n" + kSettings, "ok.png"));
}

// "Lora hashes" and "TI hashes": name and hash of each entry (A1111 quotes the list).
TEST(RecordedText, HashListsAreRead) {
    const auto r = sd::parse_parameters_text(
        "a <lora:la:0.5>\n" + kSettings + ", TI hashes: \"embone: 0123456789, neg: aaaaaaaaaa\", Lora hashes: \"la: 0123456789ab\"",
        "x.png");
    ASSERT_EQ(r.loras.size(), 1u);
    EXPECT_EQ(r.loras[0].name, "la");
    EXPECT_EQ(r.loras[0].hash, "0123456789ab");
    ASSERT_EQ(r.embeddings.size(), 2u);
    EXPECT_EQ(r.embeddings[1].name, "neg");
    EXPECT_EQ(r.embeddings[1].hash, "aaaaaaaaaa");
}

// A --lora file whose name holds a tag's syntax would be written as <lora:we:0.5:1> and
// remade as we.safetensors at 0.5: refused before it runs, naming the file.
TEST(LoraName, TagSyntaxInAFileNameIsRefused) {
    sd::Txt2ImgJob job;
    job.prompts.emplace_back();
    job.prompts[0].prompt = "a cat";
    job.loras.push_back(sd::parse_lora_flag("d/we:0.5.safetensors"));
    EXPECT_EQ(job.loras[0].name, "we:0.5");
    const std::string m = error_of([&] { sd::plan_run(job); });
    EXPECT_NE(m.find("--lora d/we:0.5.safetensors: its name \"we:0.5\" holds ':'"), std::string::npos) << m;
    job.loras[0] = sd::parse_lora_flag("d/we.safetensors:0.5");
    EXPECT_NO_THROW(sd::plan_run(job));
}

TEST(Shard, CountOverTheCapNamesTheCap) {
    EXPECT_NE(error_of([] { sd::parse_shard("0/2000000"); }).find("N is at most 1000000"), std::string::npos);
    ::setenv("JOB_COMPLETION_INDEX", "0", 1);
    ::setenv("SD_SHARD_COUNT", "2000000", 1);
    const std::string m = error_of([] { sd::parse_shard("auto"); });
    ::unsetenv("JOB_COMPLETION_INDEX");
    ::unsetenv("SD_SHARD_COUNT");
    EXPECT_NE(m.find("SD_SHARD_COUNT gives 2000000 shards; the limit is 1000000"), std::string::npos) << m;
}

// --manifest: an existing non-manifest file and an image's name in --outdir are refused.
TEST(ManifestPath, OnlyAManifestOrANewNameOutsideTheImages) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = dir + "/out";
    std::filesystem::create_directories(out);
    sdtest::write_text(dir + "/image.png", "\x89PNG\r\n\x1a\nrest");
    std::string m = error_of([&] { sd::check_manifest_path(dir + "/image.png", out); });
    EXPECT_NE(m.find("image.png is a file but not a manifest"), std::string::npos) << m;
    m = error_of([&] { sd::check_manifest_path(out + "/00000.png", out); });
    EXPECT_NE(m.find("00000.png is a name the run's images take in --outdir"), std::string::npos) << m;
    m = error_of([&] { sd::check_manifest_path(dir + "/out/../out/previews/x.png", out + "/"); });
    EXPECT_NE(m.find("is a name the run's images take"), std::string::npos) << m;
    ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
    m = error_of([&] { sd::check_manifest_path(dir + "/fifo", out); });
    EXPECT_NE(m.find("--manifest " + dir + "/fifo is a FIFO"), std::string::npos) << m;
    // a new name, an empty file and a manifest of ours are fine
    EXPECT_NO_THROW(sd::check_manifest_path(dir + "/m.jsonl", out));
    EXPECT_FALSE(sd::manifest_has_records(dir + "/m.jsonl"));
    sdtest::write_text(dir + "/empty.jsonl", "");
    EXPECT_NO_THROW(sd::check_manifest_path(dir + "/empty.jsonl", out));
    sdtest::write_text(dir + "/m.jsonl", R"({"index":0,"prompt":"a","seed":1,"path":"out/00000.png","status":"written"})" "\n");
    EXPECT_NO_THROW(sd::check_manifest_path(dir + "/m.jsonl", out));
    EXPECT_TRUE(sd::manifest_has_records(dir + "/m.jsonl"));
    EXPECT_NO_THROW(sd::check_manifest_path(dir + "/elsewhere.png", out));  // not where images go
}

// A value echoed from the file is cut short, its control characters shown as '?'.
TEST(RecordedText, EchoedValuesAreShortAndPrintable) {
    const std::string m = error_of([] {
        const auto r = sd::parse_parameters_text("a\nSteps: 2, Sampler: \x1b[2J" + std::string(100000, 'x'), "x.png");
        sd::check_honoured(r, "x.png", false);
    });
    EXPECT_NE(m.find("x.png: this tool cannot honour Sampler: ?[2Jxxx"), std::string::npos) << m.substr(0, 300);
    EXPECT_EQ(m.find('\x1b'), std::string::npos);
    EXPECT_LT(m.size(), 400u);
    EXPECT_EQ(sd::text_excerpt("caf\xc3\xa9"), "caf\xc3\xa9");
    EXPECT_EQ(sd::text_excerpt(std::string(56, 'a') + "\xc3\xa9" + std::string(10, 'b')), std::string(56, 'a') + "...");
}
