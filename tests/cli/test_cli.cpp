// sd-txt2img end to end: the reference runs, --tokenize, and bad input.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "io/code_check.h"
#include "sd/error.h"
#include "io/image_io.h"
#include "io/npy.h"
#include "io/png_text.h"
#include "test_util.h"
#include "io/weight_file.h"

using nlohmann::json;
using sdtest::run;

// Every tokenizer case of the fixtures through --tokenize (HF semantics: ids_hf where given).
TEST(Tokenize, AllFixtureCasesExactThroughCli) {
    const std::string cases_path = sdtest::env("SD_SOURCE_DIR") + "/tests/fixtures/tokenizer/cases.jsonl";
    std::vector<json> cases;
    for (const auto& l : sdtest::lines(sdtest::read_text(cases_path)))
        if (!l.empty()) cases.push_back(json::parse(l));
    ASSERT_GT(cases.size(), 200u);
    std::string prompts;
    for (const auto& c : cases) prompts += json{{"prompt", c["prompt"]}}.dump() + "\n";
    const std::string file = sdtest::temp_dir() + "/prompts.jsonl";
    sdtest::write_text(file, prompts);
    auto r = run({sdtest::cli(), "--tokenize", "--from-file", file});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto out = sdtest::lines(r.out);
    ASSERT_EQ(out.size(), cases.size());
    std::map<std::string, std::pair<int, int>> by_flag;  // flag -> (passed, total)
    int failed = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        json expected = c.contains("ids_hf") ? c["ids_hf"] : c["ids"];
        bool ok = json::parse(out[i]) == expected;
        failed += !ok;
        EXPECT_TRUE(ok) << "prompt " << c["prompt"].dump() << "\n got " << out[i] << "\n want " << expected.dump();
        for (const auto& f : c["flags"]) {
            by_flag[f.get<std::string>()].second++;
            by_flag[f.get<std::string>()].first += ok;
        }
    }
    for (const auto& [flag, pt] : by_flag) std::cerr << "flag " << flag << ": " << pt.first << "/" << pt.second << " exact\n";
    std::cerr << "all: " << cases.size() - failed << "/" << cases.size() << " exact\n";
}

// --prompt-syntax plain is CompVis's reading: prompts over 75 tokens are cut to one
// 77-token window, exactly the reference tokenizer's ids for the cases it truncated.
TEST(Tokenize, PlainSyntaxCutsLongPromptsToTheReferenceIds) {
    const std::string cases_path = sdtest::env("SD_SOURCE_DIR") + "/tests/fixtures/tokenizer/cases.jsonl";
    std::vector<json> truncated;
    for (const auto& l : sdtest::lines(sdtest::read_text(cases_path))) {
        if (l.empty()) continue;
        json c = json::parse(l);
        for (const auto& f : c["flags"])
            if (f == "truncated") truncated.push_back(c);
    }
    ASSERT_GE(truncated.size(), 5u);
    std::string prompts;
    for (const auto& c : truncated) prompts += json{{"prompt", c["prompt"]}}.dump() + "\n";
    const std::string file = sdtest::temp_dir() + "/long.jsonl";
    sdtest::write_text(file, prompts);
    auto r = run({sdtest::cli(), "--prompt-syntax", "plain", "--tokenize", "--from-file", file});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto out = sdtest::lines(r.out);
    ASSERT_EQ(out.size(), truncated.size());
    for (size_t i = 0; i < truncated.size(); ++i) {
        const auto& c = truncated[i];
        EXPECT_EQ(json::parse(out[i]), c.contains("ids_hf") ? c["ids_hf"] : c["ids"]) << c["prompt"].dump();
    }
    auto bad = run({sdtest::cli(), "--prompt-syntax", "compvis", "--tokenize", "--prompt", "a"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_EQ(bad.err, "sd-txt2img: error: --prompt-syntax must be a1111 or plain, got \"compvis\"\n");
}

// Plain syntax hands the whole text to the tokenizer, <lora:...> tags included (as
// CompVis and diffusers do); only the A1111 syntax reads them as LoRA tags. The
// tokenizer's ids of the whole text come from the same text with spaces between its
// pieces (CLIP's word split cuts "<lora:detail:0.8>" at each symbol and digit anyway),
// which no tag parser touches; "<" and ">" are 283 and 285 (the fixtures' "<html>" case).
TEST(Tokenize, PlainSyntaxLeavesLoraTagsAsText) {
    const std::string prompt = "<lora:detail:0.8> a portrait";
    auto plain = run({sdtest::cli(), "--tokenize", "--prompt-syntax", "plain", "--prompt", prompt});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    auto spaced = run({sdtest::cli(), "--tokenize", "--prompt", "< lora : detail : 0 . 8 > a portrait"});
    ASSERT_EQ(spaced.exit_code, 0) << spaced.err;
    auto a1111 = run({sdtest::cli(), "--tokenize", "--prompt", prompt});
    auto bare = run({sdtest::cli(), "--tokenize", "--prompt", "a portrait"});
    ASSERT_EQ(a1111.exit_code, 0) << a1111.err;
    const json got = json::parse(plain.out);
    EXPECT_EQ(got, json::parse(spaced.out));
    EXPECT_EQ(got[1], 283);  // "<"
    EXPECT_EQ(std::count(got.begin(), got.end(), json(285)), 1);  // ">"
    EXPECT_NE(got, json::parse(bare.out));
    // The A1111 syntax still takes the tag out of the text.
    EXPECT_EQ(json::parse(a1111.out), json::parse(bare.out));
}

// A run reads it the same way: with plain syntax a tag names no LoRA (no --lora-dir
// is asked for), and the PNG text keeps the prompt as given; a1111 wants the folder.
TEST(PlainSyntax, RunLeavesLoraTagsAsText) {
    const std::string dir = sdtest::temp_dir();
    const std::vector<std::string> base = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir",
                                           dir, "--quiet", "--H", "64", "--W", "64", "--steps", "1", "--prompt",
                                           "<lora:detail:0.8> a portrait"};
    auto plain = base;
    plain.insert(plain.end(), {"--prompt-syntax", "plain"});
    auto r = run(plain);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string png = sdtest::read_text(sdtest::lines(r.out).at(0));
    const std::string text = sd::png_read_text(std::vector<uint8_t>(png.begin(), png.end()))["parameters"];
    EXPECT_EQ(text.rfind("<lora:detail:0.8> a portrait\nSteps: 1,", 0), 0u) << text;
    EXPECT_EQ(text.find("Lora hashes"), std::string::npos) << text;
    auto a1111 = run(base);
    EXPECT_EQ(a1111.exit_code, 1);
    EXPECT_NE(a1111.err.find("needs --lora-dir"), std::string::npos) << a1111.err;

    // With --lora the PNG text keeps the prompt as given (a tag added there would be read as
    // words); --from-png then needs --lora again, and says so when it is left out.
    const std::string lora = sdtest::fixtures() + "/lora/lora_a.safetensors:0.6";
    auto with_lora = plain;
    with_lora.insert(with_lora.end(), {"--lora", lora, "--outdir", dir + "/lora"});
    auto made = run(with_lora);
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const std::string first = sdtest::lines(made.out).at(0), bytes = sdtest::read_text(first);
    const std::string recorded = sd::png_read_text(std::vector<uint8_t>(bytes.begin(), bytes.end()))["parameters"];
    EXPECT_EQ(recorded.rfind("<lora:detail:0.8> a portrait\nSteps: 1,", 0), 0u) << recorded;
    EXPECT_NE(recorded.find("Lora hashes: \"lora_a: "), std::string::npos) << recorded;
    const std::vector<std::string> remake = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--quiet",
                                             "--from-png", first};
    auto missing = remake;
    missing.insert(missing.end(), {"--outdir", dir + "/missing"});
    auto refused = run(missing);
    EXPECT_EQ(refused.exit_code, 1);
    EXPECT_EQ(sdtest::lines(refused.err).size(), 1u) << refused.err;
    EXPECT_NE(refused.err.find("give it with --lora"), std::string::npos) << refused.err;
    auto again = remake;
    again.insert(again.end(), {"--outdir", dir + "/again", "--lora", lora});
    auto remade = run(again);
    ASSERT_EQ(remade.exit_code, 0) << remade.err;
    EXPECT_EQ(sdtest::read_text(sdtest::lines(remade.out).at(0)), bytes);
}

TEST(Tokenize, PromptOptionPrintsOneLineOf77Ids) {
    auto r = run({sdtest::cli(), "--tokenize", "--prompt", ""});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json ids = json::parse(r.out);
    ASSERT_EQ(ids.size(), 77u);
    EXPECT_EQ(ids[0], 49406);
    for (size_t i = 1; i < 77; ++i) EXPECT_EQ(ids[i], 49407);
}

// ---- bad input: one clear line on stderr, non-zero exit, no crash ----

namespace {

void expect_clean_failure(const sdtest::CmdResult& r, const std::string& must_mention) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << "killed by a signal";
    auto err_lines = sdtest::lines(r.err);
    EXPECT_EQ(err_lines.size(), 1u) << "stderr:\n" << r.err;
    EXPECT_NE(r.err.find(must_mention), std::string::npos) << "stderr should mention '" << must_mention << "':\n" << r.err;
    for (const char* bad : {"terminate called", "Traceback", "Exception raised from", "Segmentation"})
        EXPECT_EQ(r.err.find(bad), std::string::npos) << r.err;
}

std::vector<std::string> base_args(const std::string& model, const std::string& outdir) {
    return {sdtest::cli(), "--model", model, "--outdir", outdir, "--quiet", "--threads", "1", "--H", "64", "--W", "64", "--steps", "2",
            "--prompt", "a cat"};
}

// A copy of the exported tiny model that a test may damage.
std::string model_copy() {
    const std::string dir = sdtest::temp_dir() + "/model";
    std::filesystem::copy(sdtest::test_models() + "/tiny-st", dir, std::filesystem::copy_options::recursive);
    return dir;
}

std::string good_model() { return sdtest::test_models() + "/tiny-st"; }

}  // namespace

TEST(BadInput, MissingModelFolder) {
    expect_clean_failure(run(base_args("/nonexistent/model", sdtest::temp_dir())), "/nonexistent/model");
}

TEST(BadInput, MissingModelFile) {
    auto m = model_copy();
    std::filesystem::remove(m + "/unet.pt");
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "unet.pt");
}

TEST(BadInput, TruncatedTorchScriptFile) {
    auto m = model_copy();
    std::filesystem::resize_file(m + "/unet.pt", std::filesystem::file_size(m + "/unet.pt") / 2);
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "unet.pt");
}

TEST(BadInput, GarbageTorchScriptFile) {
    auto m = model_copy();
    sdtest::write_text(m + "/vae_decoder.pt", std::string(5000, '\x7f'));
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "vae_decoder.pt");
}


TEST(BadInput, MissingWeightFile) {
    auto m = model_copy();
    std::filesystem::remove(m + "/unet.weights");
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "unet.weights");
}

TEST(BadInput, TruncatedWeightFile) {
    auto m = model_copy();
    std::filesystem::resize_file(m + "/unet.weights", std::filesystem::file_size(m + "/unet.weights") - 4);
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "unet.weights");
}

TEST(BadInput, WeightFileOfAnotherStage) {
    auto m = model_copy();
    std::filesystem::copy_file(m + "/vae_decoder.weights", m + "/unet.weights",
                               std::filesystem::copy_options::overwrite_existing);
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "unet.weights");
}

// Another export's weight file with the same parameter names but other shapes
// (here: two dimensions of one VAE tensor exchanged, the same bytes) is refused
// before the run starts, by the shapes the .pt records, not by a traceback from
// the middle of the run.
TEST(BadInput, WeightFileOfAnotherArchitecture) {
    auto m = model_copy();
    const std::string path = m + "/vae_decoder.weights";
    std::string bytes = sdtest::read_text(path);
    std::string name, from, to;
    for (const auto& w : sd::read_weight_index(path)) {
        if (w.shape.size() == 4 && w.shape[0] != w.shape[1]) {
            auto dims = [](int64_t a, int64_t b, int64_t c, int64_t d) {
                return "[" + std::to_string(a) + "," + std::to_string(b) + "," + std::to_string(c) + "," + std::to_string(d) + "]";
            };
            name = w.name;
            from = "\"" + name + "\":{\"dtype\":\"" + w.dtype + "\",\"shape\":" + dims(w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
            to = "\"" + name + "\":{\"dtype\":\"" + w.dtype + "\",\"shape\":" + dims(w.shape[1], w.shape[0], w.shape[2], w.shape[3]);
            break;
        }
    }
    ASSERT_FALSE(name.empty()) << "no 4-d tensor with two different leading sizes";
    const auto at = bytes.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    bytes.replace(at, from.size(), to);
    sdtest::write_text(path, bytes);
    ASSERT_NO_THROW(sd::read_weight_index(path)) << "the header itself stays valid";
    auto r = run(base_args(m, sdtest::temp_dir()));
    expect_clean_failure(r, "vae_decoder.weights");
    EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
}

// The VAE loads last, after sampling; its broken files are still reported
// before the first step (the progress lines would come first otherwise).
TEST(BadInput, BrokenVaeFilesAreReportedBeforeSampling) {
    const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> damages = {
        {"vae_decoder.weights", [](const std::string& m) {
             std::filesystem::resize_file(m + "/vae_decoder.weights", std::filesystem::file_size(m + "/vae_decoder.weights") - 4);
         }},
        {"vae_decoder.weights", [](const std::string& m) { std::filesystem::remove(m + "/vae_decoder.weights"); }},
        {"vae_decoder.pt", [](const std::string& m) {
             std::filesystem::resize_file(m + "/vae_decoder.pt", std::filesystem::file_size(m + "/vae_decoder.pt") / 2);
         }},
        {"vae_decoder.pt", [](const std::string& m) { std::filesystem::remove(m + "/vae_decoder.pt"); }},
    };
    int i = 0;
    for (const auto& [file, damage] : damages) {
        SCOPED_TRACE(std::to_string(i++) + ": " + file);
        const std::string m = model_copy();
        damage(m);
        auto args = base_args(m, sdtest::temp_dir());
        args.erase(std::find(args.begin(), args.end(), "--quiet"));
        expect_clean_failure(run(args), file);
    }
}

TEST(BadInput, GarbageModelJson) {
    auto m = model_copy();
    sdtest::write_text(m + "/model.json", "{\"format\": 1, \"scale_factor\": ");
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "model.json");
}

TEST(BadInput, GarbageVocab) {
    auto m = model_copy();
    sdtest::write_text(m + "/vocab.json", "\x01\x02 not json");
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "vocab.json");
}

// One bad flag value each: refused with one line that names it, no image.
TEST(BadInput, FlagValuesAreRefusedWithOneLine) {
    struct Case { std::string flag, value, says; };
    const std::vector<Case> cases = {
        {"--H", "72", "72"},                // not a multiple of the model's size
        {"--W", "0", "--W"},
        {"--steps", "0", "steps"},
        // CompVis: range(0, 1000, 333) + 1 ends at 1000 (the reference's IndexError).
        {"--steps", "3", "--steps 3"},
        {"--sampler", "heun9", "heun9"},
        {"--attention", "sideways", "sideways"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.flag + " " + c.value);
        auto args = base_args(good_model(), sdtest::temp_dir());
        args.insert(args.end(), {c.flag, c.value});
        expect_clean_failure(run(args), c.says);
    }
}

TEST(BadInput, UnknownFlag) {
    auto args = base_args(good_model(), sdtest::temp_dir());
    args.push_back("--no-such-flag");
    expect_clean_failure(run(args), "--no-such-flag");
}

// The kernel switches (docs/cli.md, "Environment"): a misspelt value is refused before anything
// loads (it used to change the route a benchmark measured without a word).
TEST(BadInput, UnknownKernelSwitchValues) {
    for (const std::string env : {"SD_BLOCKED_ISA=avx521", "SD_ATTENTION_ISA=sse9"}) {
        SCOPED_TRACE(env);
        const std::string out = sdtest::temp_dir() + "/out";
        auto args = base_args(good_model(), out);
        args.insert(args.begin(), {"/usr/bin/env", env});
        const auto r = run(args);
        expect_clean_failure(r, env + " names no");
        EXPECT_EQ(r.exit_code, 1);
        EXPECT_FALSE(std::filesystem::exists(out + "/00000.png"));
    }
}

// A build this CPU cannot run (DNNL_MAX_CPU_ISA=AVX2 rules out AVX-512 and AMX on any CPU): a
// setting made for another machine, so one warning line each and the run goes on.
TEST(KernelSwitches, ABuildThisCpuCannotRunIsAWarning) {
    const std::string out = sdtest::temp_dir();
    auto args = base_args(good_model(), out);
    args.insert(args.begin(), {"/usr/bin/env", "DNNL_MAX_CPU_ISA=AVX2", "SD_BLOCKED_ISA=avx512", "SD_ATTENTION_ISA=amx"});
    args.insert(args.end(), {"--prepack", "on", "--attention", "fused"});
    const auto r = run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 2u) << r.err;
    EXPECT_NE(r.err.find("warning: SD_BLOCKED_ISA=avx512: this CPU or build cannot run it"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("warning: SD_ATTENTION_ISA=amx: this CPU cannot run that kernel"), std::string::npos) << r.err;
    EXPECT_TRUE(std::filesystem::is_regular_file(out + "/00000.png"));
}

TEST(BadInput, MissingPromptFile) {
    std::vector<std::string> args = {sdtest::cli(), "--model", good_model(), "--from-file", "/nonexistent/prompts.txt"};
    expect_clean_failure(run(args), "/nonexistent/prompts.txt");
}

TEST(BadInput, PromptFileIsAFolder) {
    const std::string dir = sdtest::temp_dir();
    std::vector<std::string> args = {sdtest::cli(), "--model", good_model(), "--from-file", dir};
    expect_clean_failure(run(args), dir);
}

TEST(BadInput, EmptyPromptFile) {
    const std::string file = sdtest::temp_dir() + "/empty.txt";
    sdtest::write_text(file, "\n# only a comment\n\n");
    expect_clean_failure(run({sdtest::cli(), "--model", good_model(), "--from-file", file}), "no prompts");
}

TEST(BadInput, MalformedJsonlNamesFileAndLine) {
    const std::string file = sdtest::temp_dir() + "/p.jsonl";
    sdtest::write_text(file, "{\"prompt\": \"ok\"}\n{\"prompt\": \n");
    expect_clean_failure(run({sdtest::cli(), "--model", good_model(), "--from-file", file}), "p.jsonl:2");
}

TEST(BadInput, OutdirIsAFile) {
    const std::string file = sdtest::temp_dir() + "/a-file";
    sdtest::write_text(file, "x");
    expect_clean_failure(run(base_args(good_model(), file)), "a-file");
}

TEST(BadInput, OutdirBelowAFile) {
    const std::string file = sdtest::temp_dir() + "/a-file";
    sdtest::write_text(file, "x");
    expect_clean_failure(run(base_args(good_model(), file + "/sub")), "a-file/sub");
}

TEST(BadInput, OutdirNotWritable) {
    // /proc refuses new files even to root, unlike a chmod-ed folder.
    expect_clean_failure(run(base_args(good_model(), "/proc/sd-txt2img-test")), "/proc/sd-txt2img-test");
}

TEST(BadInput, NoPromptAtAll) {
    expect_clean_failure(run({sdtest::cli(), "--model", good_model()}), "prompt");
}

// ---- output behaviour ----

TEST(Output, NamesContinueAndNeverOverwrite) {
    const std::string out = sdtest::temp_dir();
    sdtest::write_text(out + "/00003.png", "not mine");
    auto r = run(base_args(good_model(), out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, out + "/00004.png\n");
    EXPECT_EQ(sdtest::read_text(out + "/00003.png"), "not mine");
    auto r2 = run(base_args(good_model(), out));
    EXPECT_EQ(r2.out, out + "/00005.png\n");
    // nothing but the images is left behind (no temporary files)
    int files = 0;
    for (auto& e : std::filesystem::directory_iterator(out)) files += e.is_regular_file();
    EXPECT_EQ(files, 3);
}

TEST(Output, FileOfTwoPromptsWithTwoSamplesIsOneBatch) {
    // Two different prompts in one batch and the same two as separate runs with
    // the same seed must differ for the second image only by its prompt and noise;
    // here we check the batching itself: 2 prompts x n_iter 2 = 4 images.
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.txt", "a red fox\r\n\n# comment\na blue bird\n");
    auto r = run({sdtest::cli(), "--model", good_model(), "--outdir", dir + "/out", "--quiet", "--H", "64", "--W", "64",
                  "--steps", "2", "--threads", "1", "--from-file", dir + "/p.txt", "--n_samples", "2", "--n_iter", "2",
                  "--save-latents", dir + "/l.npy"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(sdtest::lines(r.out).size(), 4u);
    auto l = sd::read_npy(dir + "/l.npy");
    EXPECT_EQ(l.shape, (std::vector<int64_t>{4, 4, 8, 8}));
}

TEST(Output, SizeDefaultsToTheSizeTheModelWasTrainedAt) {
    // The tiny model's config says image_size 8 (latent): 64x64 pictures unless --H/--W say otherwise.
    const std::string dir = sdtest::temp_dir();
    auto latent_shape = [&](std::vector<std::string> extra) {
        std::vector<std::string> args{sdtest::cli(), "--model", good_model(), "--outdir", dir + "/out", "--quiet",
                                      "--threads", "1", "--steps", "2", "--prompt", "a cat",
                                      "--save-latents", dir + "/l.npy"};
        args.insert(args.end(), extra.begin(), extra.end());
        std::filesystem::remove(dir + "/l.npy");  // --save-latents never replaces a file
        auto r = run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return sd::read_npy(dir + "/l.npy").shape;
    };
    EXPECT_EQ(latent_shape({}), (std::vector<int64_t>{1, 4, 8, 8}));
    EXPECT_EQ(latent_shape({"--H", "128"}), (std::vector<int64_t>{1, 4, 16, 8}));

    // A size the model cannot take is refused when the model loads.
    auto m = model_copy();
    std::ifstream in(m + "/model.json");
    auto info = nlohmann::json::parse(in);
    info["image_size"] = 72;
    sdtest::write_text(m + "/model.json", info.dump());
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "image_size 72");
}

TEST(Output, ScaleDefaultsToTheOneTheModelRecords) {
    auto m = model_copy();
    std::ifstream in(m + "/model.json");
    auto info = nlohmann::json::parse(in);
    info["guidance_scale"] = 2.5;
    sdtest::write_text(m + "/model.json", info.dump());
    auto scale_of = [&](std::vector<std::string> extra) {
        auto args = base_args(m, sdtest::temp_dir());
        args.push_back("--json");
        args.insert(args.end(), extra.begin(), extra.end());
        auto r = run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return nlohmann::json::parse(sdtest::lines(r.out).at(0)).at("scale").get<double>();
    };
    EXPECT_EQ(scale_of({}), 2.5);
    EXPECT_EQ(scale_of({"--scale", "7"}), 7.0);
    EXPECT_EQ(scale_of({"--scale", "7.5"}), 7.5);

    info["guidance_scale"] = -1;
    sdtest::write_text(m + "/model.json", info.dump());
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "guidance_scale");
}

// ---- trust (issue 16): nothing replaced, nothing lost, no silent wrong result, bounded resources ----

namespace {

nlohmann::json read_model_json(const std::string& model) {
    std::ifstream in(model + "/model.json");
    return nlohmann::json::parse(in);
}

int png_count(const std::string& dir) {
    int n = 0;
    if (!std::filesystem::exists(dir)) return 0;
    for (auto& e : std::filesystem::directory_iterator(dir)) n += e.path().extension() == ".png";
    return n;
}

// A failure that left no image behind; `args` writes into `outdir`.
void expect_no_image(const sdtest::CmdResult& r, const std::string& outdir, const std::string& must_mention) {
    expect_clean_failure(r, must_mention);
    EXPECT_EQ(png_count(outdir), 0) << "a PNG was written for a failed run";
}

}  // namespace

// --save-latents is checked before the first step (stderr shows no progress
// line) and replaces nothing: a file, a symlink (its target stays as it was) or
// a FIFO standing in for a device node.
TEST(Trust, SaveLatentsNeverReplacesAnything) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/file.npy", "keep me");
    sdtest::write_text(dir + "/target", "the link's target");
    std::filesystem::create_symlink(dir + "/target", dir + "/link.npy");
    std::filesystem::create_symlink(dir + "/nowhere", dir + "/dangling.npy");
    ASSERT_EQ(mkfifo((dir + "/fifo.npy").c_str(), 0644), 0);
    for (const char* name : {"file.npy", "link.npy", "dangling.npy", "fifo.npy"}) {
        const std::string out = dir + "/out-" + name;
        auto args = base_args(good_model(), out);
        args.erase(std::find(args.begin(), args.end(), "--quiet"));
        args.insert(args.end(), {"--save-latents", dir + "/" + name});
        expect_no_image(run(args), out, std::string("--save-latents ") + dir + "/" + name);
    }
    EXPECT_EQ(sdtest::read_text(dir + "/file.npy"), "keep me");
    EXPECT_EQ(sdtest::read_text(dir + "/target"), "the link's target");
    EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.npy"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/nowhere"));
    EXPECT_TRUE(std::filesystem::is_fifo(dir + "/fifo.npy"));
    // A folder that does not exist is refused before any work too.
    expect_no_image(run([&] {
                        auto a = base_args(good_model(), dir + "/out-missing");
                        a.insert(a.end(), {"--save-latents", dir + "/no/such/l.npy"});
                        return a;
                    }()),
                    dir + "/out-missing", "does not exist");
}

// Records sent to a full disk are a failure (exit 2), not a success with the records gone.
TEST(Trust, StdoutWriteFailureExitsTwo) {
    const std::string out = sdtest::temp_dir();
    auto args = base_args(good_model(), out);
    args.push_back("--json");
    std::vector<std::string> sh = {"/bin/sh", "-c", "exec \"$0\" \"$@\" > /dev/full"};
    sh.insert(sh.end(), args.begin(), args.end());
    auto r = run(sh);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("cannot write to standard output"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("1 image was written before the failure and is whole"), std::string::npos) << r.err;
    EXPECT_EQ(png_count(out), 1);  // the image itself stays
    // --tokenize's data goes the same way.
    auto t = run({"/bin/sh", "-c", "exec \"$0\" \"$@\" > /dev/full", sdtest::cli(), "--tokenize", "--prompt", "a cat"});
    EXPECT_EQ(t.exit_code, 2) << t.err;
}

TEST(Trust, NonFiniteOrOutOfRangeNumbersAreRefused) {
    for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
             {"--scale", "nan"}, {"--scale", "inf"}, {"--scale", "-inf"}, {"--scale", "1e300"}, {"--steps", "0"},
             {"--n_samples", "0"}, {"--n_iter", "0"}, {"--batch-size", "0"}, {"--H", "-64"}, {"--seed", "-5"},
             {"--seed", "18446744073709551616"}, {"--seed", "12abc"}}) {
        const std::string out = sdtest::temp_dir();
        auto args = base_args(good_model(), out);
        args.insert(args.end(), {flag, value});
        SCOPED_TRACE(flag + " " + value);
        expect_no_image(run(args), out, flag);
    }
    // The same rules for a JSONL line.
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.jsonl", "{\"prompt\": \"a\", \"scale\": 1e300}\n");
    auto args = base_args(good_model(), dir + "/out");
    args.insert(args.end(), {"--from-file", dir + "/p.jsonl"});
    args.erase(std::find(args.begin(), args.end(), "--prompt"), std::find(args.begin(), args.end(), "--prompt") + 2);
    expect_no_image(run(args), dir + "/out", "p.jsonl:1: \"scale\" must be a number from 0 to 100");
}

// NaN weights would decode to a black picture; the run stops instead (exit 2)
// and writes none: NaN in the UNet is caught in the latents, NaN in the VAE in its pixels.
TEST(Trust, NanWeightsStopTheRunWithoutAnImage) {
    for (const auto& [file, says] : std::vector<std::pair<std::string, std::string>>{
             {"unet.weights", "NaN or infinite latents"}, {"vae_decoder.weights", "VAE decoder gave NaN or infinite pixels"}}) {
        SCOPED_TRACE(file);
        auto m = model_copy();
        const std::string weights = m + "/" + file;
        std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
        const float nan = std::nanf("");
        for (const auto& w : sd::read_weight_index(weights)) {
            if (w.dtype != "F32") continue;
            f.seekp(static_cast<std::streamoff>(w.begin));
            for (uint64_t at = w.begin; at < w.end; at += 4) f.write(reinterpret_cast<const char*>(&nan), 4);
        }
        f.close();
        const std::string out = sdtest::temp_dir();
        auto r = run(base_args(m, out));
        EXPECT_EQ(r.exit_code, 2) << r.err;
        expect_no_image(r, out, says);
        if (file != "unet.weights") continue;
        // --weights q8 narrows them at load: refused there, naming the file and a layer (NaN was
        // cast to int8 as whatever the CPU gives, and no NaN reached the latents).
        auto q8 = base_args(m, out);
        q8.insert(q8.end(), {"--weights", "q8"});
        r = run(q8);
        EXPECT_EQ(r.exit_code, 1) << r.err;
        expect_no_image(r, out, "unet.weights: its tensor ");
        EXPECT_NE(r.err.find(".weight holds NaN or infinite values"), std::string::npos) << r.err;
    }
}

TEST(Trust, UnknownModelFamilyIsRefused) {
    auto m = model_copy();
    auto info = read_model_json(m);
    info["family"] = "sd3";
    sdtest::write_text(m + "/model.json", info.dump());
    const std::string out = sdtest::temp_dir();
    expect_no_image(run(base_args(m, out)), out, "unknown model family \"sd3\"");
}

// The whole unsigned 64-bit range: recorded as given, and the recorded seed remakes the same bytes.
TEST(Trust, LargestSeedIsRecordedExactlyAndRemakesTheImage) {
    const std::string seed = "18446744073709551615";
    auto make = [&](const std::string& s) {
        const std::string out = sdtest::temp_dir();
        auto args = base_args(good_model(), out);
        args.insert(args.end(), {"--seed-mode", "per-image", "--seed", s, "--json"});
        auto r = run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return nlohmann::json::parse(sdtest::lines(r.out).at(0));
    };
    const auto first = make(seed);
    EXPECT_EQ(first.at("seed").get<uint64_t>(), 18446744073709551615ull);
    const std::string params = first.at("parameters").get<std::string>();
    const auto at = params.find("Seed: ");
    ASSERT_NE(at, std::string::npos) << params;
    const std::string recorded = params.substr(at + 6, params.find(',', at) - at - 6);
    EXPECT_EQ(recorded, seed);
    const auto again = make(recorded);
    EXPECT_EQ(sdtest::read_text(first.at("path").get<std::string>()), sdtest::read_text(again.at("path").get<std::string>()));
    // A seed 2^63 away gives another image: nothing is clamped to 2^63 - 1.
    const auto other = make("9223372036854775807");
    EXPECT_NE(sdtest::read_text(first.at("path").get<std::string>()), sdtest::read_text(other.at("path").get<std::string>()));
}

TEST(Trust, ThreadCountIsCapped) {
    auto args = base_args(good_model(), sdtest::temp_dir());
    args.insert(args.end(), {"--threads", "100000"});
    expect_clean_failure(run(args), "--threads must be from 0 (one per usable CPU) to ");
}

// A prompt file without line ends stops at the line limit: its memory does not
// grow with what it reads. /dev/zero is not even opened (a device, issue 32).
TEST(Trust, EndlessPromptLineStopsAtTheLimit) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.txt", "a cat\n");
    auto small = run({sdtest::cli(), "--model", good_model(), "--tokenize", "--from-file", dir + "/p.txt"});
    ASSERT_EQ(small.exit_code, 0) << small.err;
    sdtest::write_text(dir + "/long.txt", std::string(8u << 20, 'a'));
    auto r = run({sdtest::cli(), "--model", good_model(), "--outdir", dir + "/out", "--from-file", dir + "/long.txt"});
    expect_no_image(r, dir + "/out", "long.txt:1: line longer than 256 KiB");
    auto zero = run({sdtest::cli(), "--model", good_model(), "--outdir", dir + "/out", "--from-file", "/dev/zero"});
    expect_no_image(zero, dir + "/out", "prompt file /dev/zero is a device, not a regular file");
    EXPECT_LT(r.max_rss_kib - small.max_rss_kib, 16 * 1024) << "peak RSS " << r.max_rss_kib << " KiB against "
                                                            << small.max_rss_kib << " KiB for a one-line file";
}

TEST(Trust, ModelJsonNumbersAreRangeChecked) {
    const auto good = read_model_json(good_model());
    for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
             {"context_length", 1000000000}, {"context_length", -5}, {"latent_channels", 100000},
             {"downsample_factor", 0}, {"scale_factor", "x"}, {"bos_id", 99999999}, {"eos_id", 49408},
             {"alphas_cumprod", nlohmann::json::array({0.5})}, {"alphas_cumprod", nlohmann::json::array({0.5, 2.0})}}) {
        auto m = model_copy();
        auto info = good;
        info[key] = value;
        sdtest::write_text(m + "/model.json", info.dump());
        const std::string out = sdtest::temp_dir();
        SCOPED_TRACE(key + " = " + value.dump());
        expect_no_image(run(base_args(m, out)), out, key);
    }
    auto m = model_copy();
    auto info = good;
    info["architecture"]["unet"]["model_channels"] = 1e12;
    sdtest::write_text(m + "/model.json", info.dump());
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "architecture.unet.model_channels");
}

// Messages that used to say something else than the problem.
TEST(Trust, MessagesNameTheProblem) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/model-file", "x");
    expect_clean_failure(run(base_args(dir + "/model-file", dir)), "is not a model: give an exported folder (model.json), a checkpoint");

    auto m = model_copy();
    std::filesystem::remove(m + "/vae_decoder.weights");
    std::filesystem::create_directory(m + "/vae_decoder.weights");
    expect_clean_failure(run(base_args(m, sdtest::temp_dir())), "vae_decoder.weights is a folder, not a regular file");

    // A model whose schedule is shorter than --steps says so, not just that --steps is wrong.
    auto m2 = model_copy();
    auto info = read_model_json(m2);
    info["alphas_cumprod"] = nlohmann::json::array({0.9, 0.5});
    sdtest::write_text(m2 + "/model.json", info.dump());
    auto steps50 = base_args(m2, sdtest::temp_dir());
    steps50.insert(steps50.end(), {"--steps", "50"});
    expect_clean_failure(run(steps50), "timesteps in this model's noise schedule");

    auto args = base_args(good_model(), sdtest::temp_dir());
    args.back() = std::string(17000, 'a');
    expect_clean_failure(run(args), "far more than any prompt needs");
}

// ---- README "Security": no code of a model file runs unless the export could have written it ----


// A model folder whose .pt runs code on load (a scripted __setstate__ that maps a file,
// tests/python/payloads.py) is refused with one line before anything loads, whichever
// stage it is; the same file loaded by plain torch.jit.load does write the marker, so
// the test can fail.
TEST(Trust, ModelFileThatRunsCodeOnLoadIsRefused) {
    const std::string python = sdtest::env("SD_PYTHON");
    const std::string payloads = sdtest::env("SD_SOURCE_DIR") + "/tests/python/payloads.py";
    for (const std::string stage : {"unet", "vae_decoder"}) {
        SCOPED_TRACE(stage);
        const std::string m = model_copy();
        const std::string marker = sdtest::temp_dir() + "/marker";
        const std::string pt = m + "/" + stage + ".pt";
        auto made = run({python, payloads, marker, pt});
        ASSERT_EQ(made.exit_code, 0) << made.err;
        auto args = base_args(m, sdtest::temp_dir());
        args.erase(std::find(args.begin(), args.end(), "--quiet"));  // refused before any progress line
        auto r = run(args);
        EXPECT_FALSE(std::filesystem::exists(marker)) << "the payload ran";
        expect_clean_failure(r, pt);
        EXPECT_NE(r.err.find("(torch.from_file)"), std::string::npos) << r.err;
        auto loaded = run({python, "-c", "import sys, torch; torch.jit.load(sys.argv[1])", pt});
        EXPECT_TRUE(std::filesystem::exists(marker)) << "torch.jit.load of the payload wrote nothing: the test proves nothing\n"
                                                     << loaded.err;
    }
}

// scripts/quickstart.sh: only the image's path reaches stdout; what its set-up
// and build print goes to stderr. Run in a copy whose set-up, build and tool are
// stand-ins that each print a line on stdout.
TEST(Quickstart, OnlyTheImagePathGoesToStdout) {
    namespace fs = std::filesystem;
    const std::string root = sdtest::temp_dir();
    fs::create_directories(root + "/scripts");
    fs::create_directories(root + "/build");
    fs::copy_file(sdtest::env("SD_SOURCE_DIR") + "/scripts/quickstart.sh", root + "/scripts/quickstart.sh");
    sdtest::write_text(root + "/scripts/setup.sh", "#!/bin/sh\necho setup: all packages present\n");
    sdtest::write_text(root + "/scripts/build.sh", "#!/bin/sh\necho '[100%] Built target sd-txt2img'\n");
    sdtest::write_text(root + "/build/sd-txt2img", "#!/bin/sh\necho outputs/quickstart/00000.png\n");
    for (const char* f : {"/scripts/quickstart.sh", "/scripts/setup.sh", "/scripts/build.sh", "/build/sd-txt2img"})
        fs::permissions(root + f, fs::perms::owner_all);
    auto r = run({"/bin/bash", root + "/scripts/quickstart.sh", "a red circle"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "outputs/quickstart/00000.png\n");
    EXPECT_NE(r.err.find("Built target"), std::string::npos) << r.err;
}

// SDXL's size conditioning (issue 20) on a model without it: one line, before anything runs.
TEST(SdxlCliErrors, SizeConditioningOnAnSd1ModelIsOneLine) {
    auto r = sdtest::run({sdtest::cli(), "--model", good_model(), "--prompt", "a", "--outdir",
                          sdtest::temp_dir(), "--original-size", "64x64"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("SDXL"), std::string::npos) << r.err;
}

namespace {

// The line of a one-step 64x64 run's output that holds `marker`, the run started by
// /usr/bin/env with `env` (e.g. {"-u", "X", "Y=1"}): what a library the engine module
// loads printed about the settings it read when it loaded.
std::string line_of_run(const std::vector<std::string>& env, const std::string& marker) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    for (const std::string a : {sdtest::cli(), std::string("--model"), good_model(), std::string("--prompt"),
                                std::string("a"), std::string("--steps"), std::string("1"), std::string("--H"),
                                std::string("64"), std::string("--W"), std::string("64"), std::string("--quiet"),
                                std::string("--outdir"), sdtest::temp_dir()})
        argv.push_back(a);
    const auto r = sdtest::run(argv);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const auto& line : sdtest::lines(r.out + r.err))
        if (line.find(marker) != std::string::npos) return line;
    return "(no line with \"" + marker + "\")";
}

}  // namespace

// libgomp reads OMP_WAIT_POLICY when the engine module loads it: the tool's
// passive default reaches it without a restart, and a user's value is kept.
TEST(Threads, OpenMpWaitsPassivelyUnlessTheUserSaysOtherwise) {
    const std::vector<std::string> env = {"-u", "OMP_WAIT_POLICY", "OMP_DISPLAY_ENV=true"};
    const auto passive = line_of_run(env, "OMP_WAIT_POLICY = ");
    EXPECT_NE(passive.find("'PASSIVE'"), std::string::npos) << passive;
    auto with_active = env;
    with_active.push_back("OMP_WAIT_POLICY=ACTIVE");
    const auto active = line_of_run(with_active, "OMP_WAIT_POLICY = ");
    EXPECT_NE(active.find("'ACTIVE'"), std::string::npos) << active;
}

// OpenBLAS 0.3.21 falls back to its SSE3 kernels on CPU models newer than it
// (sd/engine.h): on a CPU with AVX-512 the tool names its SkylakeX ones when the
// engine module loads it, and a user's OPENBLAS_CORETYPE is kept.
TEST(Threads, OpenBlasUsesItsAvx512KernelsUnlessTheUserSaysOtherwise) {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl"))
        GTEST_SKIP() << "no AVX-512 on this CPU: OpenBLAS's own choice stands";
    const std::vector<std::string> env = {"-u", "OPENBLAS_CORETYPE", "OPENBLAS_VERBOSE=2"};
    const auto named = line_of_run(env, "Core: ");
    EXPECT_NE(named.find("SkylakeX"), std::string::npos) << named;
    auto with_haswell = env;
    with_haswell.push_back("OPENBLAS_CORETYPE=Haswell");
    const auto chosen = line_of_run(with_haswell, "Core: ");
    EXPECT_NE(chosen.find("Haswell"), std::string::npos) << chosen;
#else
    GTEST_SKIP() << "x86-64 only";
#endif
}

// A picture whose EXIF orientation tells viewers to turn it is used as stored (as
// the references' PIL reads it), and the user is told: once per file in a run (a
// stream plans each line on its own), even with --quiet; a picture without the
// tag gives no warning.
TEST(Pictures, ExifOrientationIsWarnedAboutOnce) {
    const std::string pictures = sdtest::env("SD_SOURCE_DIR") + "/tests/data/pictures";
    auto img2img = [&](const std::string& picture) {
        return run({sdtest::cli(), "--model", good_model(), "--outdir", sdtest::temp_dir(), "--quiet", "--threads",
                    "1", "--H", "64", "--W", "64", "--steps", "2", "--strength", "0.5", "--init-img",
                    pictures + "/" + picture, "--from-file", "-"},
                   "a cat\na dog\n");
    };
    const auto turned = img2img("exif6.jpg");
    ASSERT_EQ(turned.exit_code, 0) << turned.err;
    const std::string warning = "sd-txt2img: warning: --init-img " + pictures +
                                "/exif6.jpg: its EXIF orientation is 6 (viewers turn it 90 degrees clockwise)";
    ASSERT_NE(turned.err.find(warning), std::string::npos) << turned.err;
    EXPECT_EQ(turned.err.find(warning, turned.err.find(warning) + 1), std::string::npos) << turned.err;
    EXPECT_EQ(sdtest::lines(turned.out).size(), 2u);  // both images written
    const auto plain = img2img("rgb.jpg");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_EQ(plain.err.find("EXIF"), std::string::npos) << plain.err;
}
