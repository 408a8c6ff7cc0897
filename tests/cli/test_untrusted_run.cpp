// Issue 32, run side: crafted PNGs for --from-png, --seed -1 with sets of
// runs, --manifest paths and the run's messages. Every refusal is checked the
// same way (expect_refused): exit 1 or 2, one line on stderr naming the file,
// ended within 30 s (a hang is a failure), peak RSS under 300 MB, and no file
// of the output folder changed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "io/embedding_file.h"
#include "io/image_io.h"
#include "io/png_text.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

constexpr int kLimitSeconds = 30;
constexpr long kMaxRssKib = 300 * 1024;

using Bounded = sdtest::CmdResult;

// argv run without a shell, killed after kLimitSeconds; its peak RSS from wait4.
Bounded run_bounded(const std::vector<std::string>& argv) { return sdtest::run(argv, "", kLimitSeconds); }

// Every regular file under dir and its bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
    std::map<std::string, std::string> files;
    std::error_code ec;
    if (!fs::exists(dir, ec)) return files;
    for (const auto& e : fs::recursive_directory_iterator(dir, ec))
        if (e.is_regular_file()) files[e.path().string()] = sdtest::read_text(e.path().string());
    return files;
}

void expect_refused(const Bounded& r, const std::string& must_mention, const std::map<std::string, std::string>& before,
                    const std::string& outdir) {
    EXPECT_FALSE(r.timed_out) << "still running after " << kLimitSeconds << " s";
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << "exit " << r.exit_code << "\n" << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << "stderr:\n" << r.err.substr(0, 2000);
    EXPECT_NE(r.err.find(must_mention), std::string::npos) << "stderr should mention '" << must_mention << "':\n" << r.err;
    EXPECT_LT(r.max_rss_kib, kMaxRssKib) << "peak RSS " << r.max_rss_kib / 1024 << " MB";
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(snapshot(outdir) == before) << "a file in " << outdir << " changed";
}

std::vector<std::string> tool(const std::string& outdir, const std::string& model, std::vector<std::string> more) {
    std::vector<std::string> v = {sdtest::cli(), "--model", model, "--outdir", outdir, "--threads", "1"};
    v.insert(v.end(), more.begin(), more.end());
    return v;
}

std::string tiny() { return sdtest::test_models() + "/tiny-st"; }

// Checks that must come before the model loads are run with a model folder that does not
// exist: had the tool tried to load it, the message would be about the model, not the file.
std::string no_model(const std::string& dir) { return dir + "/no-model"; }

std::vector<uint8_t> small_png() {
    sd::Image img;
    img.width = img.height = 8;
    img.rgb.assign(8 * 8 * 3, 90);
    return sd::encode_png(img);
}

// A PNG with one chunk of any type and data after IHDR; its CRC wrong when told.
void write_png_with(const std::string& path, const std::string& type, const std::string& data, bool good_crc = true) {
    const auto png = small_png();
    std::string c;
    for (int s = 24; s >= 0; s -= 8) c += static_cast<char>(data.size() >> s);
    c += type + data;
    const uint32_t crc = sd::png_crc32(reinterpret_cast<const uint8_t*>(c.data()) + 4, c.size() - 4) ^ (good_crc ? 0u : 1u);
    for (int s = 24; s >= 0; s -= 8) c += static_cast<char>(crc >> s);
    sdtest::write_text(path, std::string(png.begin(), png.begin() + 33) + c + std::string(png.begin() + 33, png.end()));
}

void write_itxt_png(const std::string& path, const std::string& parameters) {
    write_png_with(path, "iTXt", std::string("parameters") + std::string(5, '\0') + parameters);
}

void write_text_png(const std::string& path, const std::string& latin1_parameters) {
    write_png_with(path, "tEXt", std::string("parameters") + '\0' + latin1_parameters);
}

// The settings line of an image the tiny model can remake quickly.
const std::string kPerImage = "Steps: 2, Sampler: DDIM, CFG scale: 7.5, Seed: 5, Size: 64x64, Model: tiny, "
                              "Seed mode: per-image, Image index: 0";

// A folder with one file in it already, so that "no file changed" has something to watch.
std::string outdir_with_a_file(const std::string& dir) {
    const std::string out = dir + "/out";
    fs::create_directories(out);
    sdtest::write_text(out + "/keep.txt", "untouched");
    return out;
}

}  // namespace

// Point 3: special files and huge or bad text, refused before the model loads.
TEST(FromPngHostile, SpecialFilesAndBadTextGiveOneLine) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    ASSERT_EQ(mkfifo((dir + "/fifo.png").c_str(), 0600), 0);
    fs::create_directories(dir + "/folder.png");
    write_itxt_png(dir + "/huge.png", std::string(1200000, 'a') + "\n" + kPerImage);           // over the chunk bound
    write_itxt_png(dir + "/long.png", std::string(20000, 'a') + "\n" + kPerImage);             // over the prompt limit
    write_text_png(dir + "/nul.png", std::string("a\0cat", 5) + "\n" + kPerImage);             // NUL in a tEXt prompt
    write_itxt_png(dir + "/latin.png", "a caf\xe9\n" + kPerImage);                             // iTXt that is not UTF-8
    write_text_png(dir + "/neg.png", "a cat\nNegative prompt: " + std::string(17000, 'b') + "\n" + kPerImage);
    write_png_with(dir + "/crc.png", "\x1b[2J", "x", false);                                   // bad CRC, a control code
    write_itxt_png(dir + "/big.png", "a cat\n" + kPerImage);
    fs::resize_file(dir + "/big.png", (64u << 20) + 1);                                        // sparse: past the cap
    for (const auto& [file, says] : std::vector<std::pair<std::string, std::string>>{
             {"/dev/zero", "--from-png /dev/zero is a device, not a regular file"},
             {dir + "/fifo.png", "fifo.png is a FIFO"},
             {dir + "/folder.png", "folder.png is a folder"},
             {dir + "/huge.png", "huge.png is not a readable PNG: text chunk \"parameters\" holds 1200"},
             {dir + "/long.png", "long.png: the prompt is 20000 bytes long; the limit is 16384"},
             {dir + "/nul.png", "nul.png: the prompt contains a NUL"},
             {dir + "/latin.png", "latin.png is not a readable PNG: iTXt chunk \"parameters\" is not valid UTF-8"},
             {dir + "/neg.png", "neg.png: the negative prompt is 17000 bytes long"},
             {dir + "/crc.png", "crc.png is not a readable PNG: bad CRC in PNG chunk \\x1b[2J"},
             {dir + "/big.png", "big.png is 67108865 bytes, more than the 67108864 this reader takes"}}) {
        SCOPED_TRACE(file);
        const auto before = snapshot(out);
        const auto r = run_bounded(tool(out, no_model(dir), {"--from-png", file}));
        expect_refused(r, says, before, out);
        EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "a raw control code on stderr";
    }
}

// Point 3: a Latin-1 tEXt prompt ("café" as PIL and AUTOMATIC1111 store it) is the UTF-8 prompt "café".
TEST(FromPngHostile, Latin1TextIsReadAsUtf8) {
    const std::string dir = sdtest::temp_dir();
    write_text_png(dir + "/cafe.png", "a caf\xe9 au lait\n" + kPerImage);
    const auto r = run_bounded(tool(dir + "/out", tiny(), {"--quiet", "--json", "--from-png", dir + "/cafe.png"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["prompt"], "a caf\xc3\xa9 au lait");
    const std::string bytes = sdtest::read_text(j["path"]);
    EXPECT_EQ(sd::png_read_text(std::vector<uint8_t>(bytes.begin(), bytes.end())).at("parameters").rfind("a caf\xc3\xa9 au lait\n", 0),
              0u);
    // the same image as the prompt given as a flag
    const auto flag = run_bounded(tool(dir + "/flag", tiny(), {"--quiet", "--json", "--prompt", "a caf\xc3\xa9 au lait", "--H", "64",
                                                                "--W", "64", "--steps", "2", "--sampler", "ddim", "--seed", "5",
                                                                "--seed-mode", "per-image", "--scale", "7.5"}));
    ASSERT_EQ(flag.exit_code, 0) << flag.err;
    EXPECT_EQ(sd::read_png(nlohmann::json::parse(flag.out)["path"]).rgb, sd::read_png(j["path"]).rgb);
}

// Point 6: a LoRA that changed since the image was made is refused (before the model
// loads), naming the file and both hashes; --ignore-hash-mismatch makes it a warning.
TEST(FromPngHostile, ChangedLoraIsRefusedUnlessIgnored) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    fs::create_directories(dir + "/loras");
    fs::copy_file(sdtest::fixtures() + "/lora/lora_a.safetensors", dir + "/loras/la.safetensors");
    write_itxt_png(dir + "/x.png", "a cat <lora:la:0.5>\n" + kPerImage + ", Lora hashes: \"la: 0123456789ab\"");
    const auto before = snapshot(out);
    const auto r = run_bounded(tool(out, no_model(dir), {"--lora-dir", dir + "/loras", "--from-png", dir + "/x.png"}));
    expect_refused(r, "x.png records the LoRA " + dir + "/loras/la.safetensors with hash 0123456789ab, but the file's hash is now ",
                   before, out);
    EXPECT_NE(r.err.find("--ignore-hash-mismatch"), std::string::npos) << r.err;

    const auto ok = run_bounded(tool(out, tiny(), {"--quiet", "--lora-dir", dir + "/loras", "--ignore-hash-mismatch",
                                                   "--from-png", dir + "/x.png"}));
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_EQ(sdtest::lines(ok.err).size(), 1u) << ok.err;
    EXPECT_NE(ok.err.find("warning: " + dir + "/x.png records the LoRA"), std::string::npos) << ok.err;
    EXPECT_TRUE(fs::exists(out + "/00000.png"));
}

// Point 6: an embedding whose hash differs from the PNG's "TI hashes" is refused, naming the file.
TEST(FromPngHostile, ChangedEmbeddingIsRefused) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    write_itxt_png(dir + "/x.png", "a photo of embone\n" + kPerImage + ", TI hashes: \"embone: 0000000000\"");
    const std::string emb = sdtest::fixtures() + "/embeddings/embone.safetensors";
    const auto before = snapshot(out);
    const auto r = run_bounded(tool(out, tiny(), {"--quiet", "--embedding", emb, "--from-png", dir + "/x.png"}));
    expect_refused(r, "x.png records the embedding " + emb + " with hash 0000000000, but the file's hash is now ", before, out);
    // with the file's own hash (A1111's: its SHA-256's first 10 hex digits) it is remade
    write_itxt_png(dir + "/same.png", "a photo of embone\n" + kPerImage + ", TI hashes: \"embone: " +
                                          sd::embedding_short_hash(emb) + "\"");
    const auto ok = run_bounded(tool(out, tiny(), {"--quiet", "--embedding", emb, "--from-png", dir + "/same.png"}));
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_EQ(ok.err, "");
}

// Point 6: a --lora file named we:0.5.safetensors is refused, not recorded as <lora:we:0.5:1>.
TEST(FromPngHostile, LoraNameWithAColonIsRefused) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    fs::copy_file(sdtest::fixtures() + "/lora/lora_a.safetensors", dir + "/we:0.5.safetensors");
    const auto before = snapshot(out);
    const auto r = run_bounded(tool(out, no_model(dir), {"--prompt", "a cat", "--lora", dir + "/we:0.5.safetensors"}));
    expect_refused(r, "--lora " + dir + "/we:0.5.safetensors: its name \"we:0.5\" holds ':'", before, out);
}

// Point 9: a compvis batch of 4096 to replay, and a Clip skip the model cannot do, are the PNG's.
TEST(FromPngHostile, RecordedValuesAreNamedAsThePngs) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    write_itxt_png(dir + "/batch.png", "a cat\nSteps: 2, Sampler: DDIM, CFG scale: 7.5, Seed: 5, Size: 64x64, Model: tiny-st, "
                                       "Seed mode: compvis, Image index: 0, Batch size: 4096, Batch position: 4095, Batch number: 0");
    write_itxt_png(dir + "/skip.png", "a cat\n" + kPerImage + ", Clip skip: 1000");
    auto before = snapshot(out);
    auto r = run_bounded(tool(out, no_model(dir), {"--from-png", dir + "/batch.png"}));
    expect_refused(r, "batch.png: this image is one of a compvis batch of 4096 images", before, out);
    EXPECT_NE(r.err.find("batches over 64 are refused"), std::string::npos) << r.err;
    r = run_bounded(tool(out, tiny(), {"--quiet", "--from-png", dir + "/skip.png"}));
    expect_refused(r, "skip.png: \"Clip skip\" 1000 skips more layers than this model's text encoder runs", before, out);
    EXPECT_EQ(r.err.find("--clip-skip"), std::string::npos) << r.err;
}

// Point 9: "TI hashes" with 100,000 names not loaded: one note, not 100,000 lines.
TEST(FromPngHostile, ManyMissingEmbeddingsGiveOneNote) {
    const std::string dir = sdtest::temp_dir();
    // names aaaa, aaab, ...: 100,000 of them in under a megabyte, the bound of a text chunk
    std::string list;
    for (int i = 0; i < 100000; ++i) {
        std::string name(4, 'a');
        for (int k = 3, v = i; k >= 0; --k, v /= 26) name[k] = static_cast<char>('a' + v % 26);
        list += (i ? ", " : "") + name + ": h";
    }
    write_itxt_png(dir + "/x.png", "a cat\n" + kPerImage + ", TI hashes: \"" + list + "\"");
    const auto r = run_bounded(tool(dir + "/out", tiny(), {"--from-png", dir + "/x.png"}));
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
    EXPECT_LT(r.max_rss_kib, kMaxRssKib);
    int notes = 0;
    for (const auto& l : sdtest::lines(r.err)) notes += l.find("embedding") != std::string::npos;
    EXPECT_EQ(notes, 1) << r.err.substr(0, 2000);
    EXPECT_NE(r.err.find("\"aaaa\", \"aaab\", \"aaac\" and 99997 more"), std::string::npos) << r.err.substr(0, 2000);
    EXPECT_LT(r.err.size(), 4000u);
}

// Point 5: --seed -1 draws a seed per process: refused where runs must add up to one set.
TEST(SeedSets, RandomSeedIsRefusedForShardsResumesAndManifests) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    sdtest::write_text(dir + "/p.txt", "a\nb\n");
    sdtest::write_text(dir + "/m.jsonl", R"({"index":0,"prompt":"a","seed":1,"path":"x/00000.png","status":"written"})" "\n");
    const std::vector<std::string> common = {"--from-file", dir + "/p.txt", "--seed", "-1", "--seed-mode", "per-image"};
    for (const auto& [more, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"--shard", "0/2"}, "--seed -1 draws a new seed in every process, which breaks --shard"},
             {{"--skip-existing"}, "which breaks --skip-existing"},
             {{"--manifest", dir + "/m.jsonl"}, "which breaks a --manifest that holds lines"}}) {
        SCOPED_TRACE(says);
        auto argv = tool(out, no_model(dir), common);
        argv.insert(argv.end(), more.begin(), more.end());
        const auto before = snapshot(dir);
        expect_refused(run_bounded(argv), says, before, dir);
    }
}

// Point 8: --manifest on an existing image, on an image's name in --outdir, on a FIFO.
TEST(ManifestPathCli, NonManifestTargetsAreRefusedBeforeWriting) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    write_itxt_png(out + "/00001.png", "a cat\n" + kPerImage);
    write_itxt_png(dir + "/photo.png", "a cat\n" + kPerImage);
    ASSERT_EQ(mkfifo((dir + "/fifo.jsonl").c_str(), 0600), 0);
    for (const auto& [manifest, says] : std::vector<std::pair<std::string, std::string>>{
             {out + "/00001.png", "00001.png is a name the run's images take in --outdir"},
             {dir + "/photo.png", "photo.png is a file but not a manifest"},
             {out + "/00000.png", "00000.png is a name the run's images take in --outdir"},
             {dir + "/fifo.jsonl", "fifo.jsonl is a FIFO"}}) {
        SCOPED_TRACE(manifest);
        const auto before = snapshot(dir);
        const auto r = run_bounded(tool(out, tiny(), {"--prompt", "a cat", "--seed-mode", "per-image", "--skip-existing",
                                                      "--manifest", manifest}));
        expect_refused(r, says, before, dir);
        EXPECT_FALSE(fs::exists(out + "/00000.png"));
    }
}

// Point 9: a JSONL line's LoRA error names its line once; SD_SHARD_COUNT names its cap;
// a prompt file that is a FIFO or a folder is refused.
TEST(RunMessages, OneLineEach) {
    const std::string dir = sdtest::temp_dir();
    const std::string out = outdir_with_a_file(dir);
    fs::create_directories(dir + "/loras");
    sdtest::write_text(dir + "/loras/bad.safetensors", std::string(8, '\0') + "{}");
    sdtest::write_text(dir + "/j1.jsonl", "{\"prompt\": \"a cat\"}\n{\"prompt\": \"a dog <lora:bad:1>\"}\n");
    auto before = snapshot(out);
    auto r = run_bounded(tool(out, tiny(), {"--quiet", "--H", "64", "--W", "64", "--steps", "2", "--sampler", "ddim",
                                            "--lora-dir", dir + "/loras", "--from-file", dir + "/j1.jsonl"}));
    expect_refused(r, dir + "/j1.jsonl:2: ", before, out);
    EXPECT_EQ(r.err.find("j1.jsonl:2: " + dir + "/j1.jsonl:2:"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("j1.jsonl:2", r.err.find("j1.jsonl:2") + 1), std::string::npos) << r.err;

    r = run_bounded({"/usr/bin/env", "JOB_COMPLETION_INDEX=0", "SD_SHARD_COUNT=2000000", sdtest::cli(), "--model",
                     no_model(dir), "--outdir", out, "--from-file", dir + "/j1.jsonl", "--seed-mode", "per-image", "--shard",
                     "auto"});
    expect_refused(r, "SD_SHARD_COUNT gives 2000000 shards; the limit is 1000000", before, out);

    ASSERT_EQ(mkfifo((dir + "/prompts.fifo").c_str(), 0600), 0);
    fs::create_directories(dir + "/prompts.d");
    for (const auto& [file, says] : std::vector<std::pair<std::string, std::string>>{
             {dir + "/prompts.fifo", "prompts.fifo is a FIFO"}, {dir + "/prompts.d", "prompts.d is a folder"}}) {
        r = run_bounded(tool(out, no_model(dir), {"--from-file", file}));
        expect_refused(r, "prompt file " + file, before, out);
        EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    }
}
