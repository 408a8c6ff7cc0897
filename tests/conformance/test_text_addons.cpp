// Clip skip and textual-inversion embeddings (issue 19 parts 4 and 5) against the
// diffusers reference runs of tests/fixtures/clip_skip and tests/fixtures/embeddings:
// the text encoder stage by stage (cond <= 1e-4), and whole cases through the CLI
// (latents <= 1e-4 x max|reference|, image <= 1 level on <= 0.1% of values), with
// the README's must-FAIL variations failing; and their bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <torch/script.h>

#include "conformance_util.h"
#include "diffusers_case.h"
#include "engine/conditioning.h"
#include "engine/embeddings.h"
#include "engine/stage_loader.h"
#include "io/png_text.h"
#include "prompt_util.h"
#include "sd/model_config.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::string tiny() { return sdtest::test_models() + "/tiny-st"; }
std::string clip_skip_dir() { return sdtest::fixtures() + "/clip_skip"; }
std::string emb_dir() { return sdtest::fixtures() + "/embeddings"; }
std::string emb_case(const std::string& name) { return emb_dir() + "/cases/" + name; }
std::string cs_case(const std::string& name) { return clip_skip_dir() + "/cases/" + name; }

torch::jit::Module text_encoder(const std::string& model = tiny()) { return sd::load_stage(model + "/text_encoder.pt"); }

double max_diff(const at::Tensor& a, const at::Tensor& b) {
    EXPECT_EQ(a.sizes(), b.sizes());
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The pipeline's conditioning (encode_conditioning with the text encoder as the
// pipeline calls it): clip skip `skip` (layers) for the prompt, none for the negative.
sd::Conditioning condition(torch::jit::Module& te, const std::string& prompt, int64_t skip,
                           const std::vector<sd::Embedding>& embeddings, const std::string& negative = "") {
    const auto config = sd::load_model_config(tiny());
    const at::Tensor extra = sd::embedding_table(embeddings, config.context_dim);
    auto encoder = [&](int64_t k) -> sd::TextEncodeFn {
        return [&, k](const at::Tensor& ids) { return sd::encode_ids(te, ids, k, extra); };
    };
    const auto added = sd::added_words(embeddings, sd::token_table(te).size(0));
    return sd::encode_conditioning(encoder(skip), encoder(0), sdtest::clip(), config, {prompt}, {negative}, {}, added);
}

// The embedding file each case loads (args.json "embeddings": [[file, token], ...]).
std::vector<std::string> case_embedding_files(const std::string& name) {
    std::vector<std::string> files;
    const auto args = sdtest::read_json(emb_case(name) + "/args.json");
    for (const auto& e : args["embeddings"])
        files.push_back(emb_dir() + "/" + e[0].get<std::string>());
    return files;
}

const std::vector<std::string> kEmbeddingCases = {"e_one_pt_ddim10_64x64", "e_three_safetensors_ddim10_64x96",
                                                  "e_diffusers_ddim10_64x64"};

// A one-line refusal: exit 1, one line on stderr that holds `what`, no image.
void expect_refused(const sdtest::CmdResult& r, const std::string& what) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
}

std::vector<std::string> quick_args(const std::string& model, const std::string& prompt) {
    return {sdtest::cli(), "--model", model, "--outdir", sdtest::temp_dir(), "--quiet", "--threads", "1",
            "--H", "64", "--W", "64", "--steps", "2", "--sampler", "ddim", "--prompt", prompt};
}

// An A1111-style .safetensors embedding: one F32 tensor "emb_params" [rows, width].
void write_embedding(const std::string& path, int rows, int width) {
    const std::string header = "{\"emb_params\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(rows) + "," +
                               std::to_string(width) + "],\"data_offsets\":[0," + std::to_string(rows * width * 4) + "]}}";
    std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((padded.size() >> (8 * i)) & 0xff);
    bytes += padded + std::string(static_cast<size_t>(rows * width * 4), '\0');
    sdtest::write_text(path, bytes);
}

}  // namespace

// ---- clip skip ----

// The text encoder with clip_skip = k layers skipped against diffusers' encode_prompt(clip_skip=k)
// for every prompt of cond_prompts (k = 0: no skip); our token ids are the reference's exactly.
TEST(ClipSkipStage, CondPromptsAtEveryDepth) {
    c10::InferenceMode guard;
    auto te = text_encoder();
    const at::Tensor tokens = sdtest::load_tensor(clip_skip_dir() + "/cond_prompts/tokens.npy");
    const auto prompts = sdtest::read_json(clip_skip_dir() + "/cond_prompts/args.json")["prompts"];
    for (int64_t i = 0; i < tokens.size(0); ++i) {
        const auto ids = sdtest::clip().encode_padded(prompts[i].get<std::string>());
        EXPECT_TRUE(at::equal(at::tensor(ids), tokens[i])) << prompts[i];
    }
    for (int64_t k : {0, 1, 2}) {
        te.setattr("clip_skip", k);
        const auto ref = sdtest::load_tensor(clip_skip_dir() + "/cond_prompts/cond_clip_skip_" + std::to_string(k) + ".npy");
        const double d = max_diff(te.forward({tokens}).toTensor(), ref);
        EXPECT_LE(d, 1e-4) << "clip_skip " << k;
        if (k > 0) {  // the fixture's must-FAIL variation: clip skip off
            const auto unskipped = sdtest::load_tensor(clip_skip_dir() + "/cond_prompts/cond_clip_skip_0.npy");
            EXPECT_GT(max_diff(unskipped, ref), 1e-2) << "clip_skip " << k << " changes nothing: the test proves nothing";
        }
    }
}

// The conditioning the pipeline builds: the prompt clip-skipped, the "" negative at full depth (as diffusers).
TEST(ClipSkipStage, CasesCondSkippedUncondFullDepth) {
    c10::InferenceMode guard;
    auto te = text_encoder();
    for (const auto& [name, skip] : {std::pair{"cs1_ddim10_64x64", 1}, std::pair{"cs2_ddim10_64x96", 2}}) {
        const auto a = sdtest::read_json(cs_case(name) + "/args.json");
        const auto c = condition(te, a["prompt"].get<std::string>(), skip, {});
        EXPECT_LE(max_diff(c.cond[0], sdtest::load_tensor(cs_case(name) + "/cond.npy")[0]), 1e-4) << name;
        EXPECT_LE(max_diff(c.uncond[0], sdtest::load_tensor(cs_case(name) + "/uncond.npy")[0]), 1e-4) << name;
    }
}

// Both public cases through the CLI: diffusers' clip_skip k is --clip-skip k + 1; the PNG records it as A1111 does.
TEST(ClipSkipCli, PublicCasesMatch) {
    for (const auto& [name, flag] : {std::pair{"cs1_ddim10_64x64", "2"}, std::pair{"cs2_ddim10_64x96", "3"}}) {
        const auto run = sdtest::run_diffusers_case(cs_case(name), tiny(), {"--clip-skip", flag, "--threads", "1"});
        EXPECT_TRUE(run.matches()) << name << ": " << run.describe();
        EXPECT_NE(run.parameters.find(std::string(", Clip skip: ") + flag + ","), std::string::npos) << run.parameters;
    }
}

// The README's must-FAIL variation: without clip skip the case does not match.
TEST(ClipSkipCli, ClipSkipOffFails) {
    const auto run = sdtest::run_diffusers_case(cs_case("cs1_ddim10_64x64"), tiny(), {"--threads", "1"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_FALSE(run.matches()) << run.describe();
    EXPECT_EQ(run.parameters.find("Clip skip"), std::string::npos) << run.parameters;
}

// 0, and more than the tiny encoder's 2 layers + 1, are refused in one line before anything runs.
TEST(ClipSkipCli, OutOfRangeRefused) {
    auto args = quick_args(tiny(), "a cat");
    for (const auto& [value, what] : {std::pair{"0", "--clip-skip must be at least 1"},
                                      std::pair{"4", "the largest clip skip is 3"}}) {
        auto a = args;
        a.insert(a.end(), {"--clip-skip", value});
        expect_refused(sdtest::run(a), what);
    }
    args.insert(args.end(), {"--clip-skip", "3"});  // the embeddings alone: allowed
    EXPECT_EQ(sdtest::run(args).exit_code, 0);
}

// A --from-png remake reads "Clip skip" back: the same image again, and without it another one.
TEST(ClipSkipCli, FromPngReadsClipSkip) {
    auto args = quick_args(tiny(), "a red fox");
    args.insert(args.end(), {"--clip-skip", "2", "--save-latents", sdtest::temp_dir() + "/a.npy"});
    const auto first = sdtest::run(args);
    ASSERT_EQ(first.exit_code, 0) << first.err;
    const std::string png = sdtest::lines(first.out).at(0);
    const std::string out = sdtest::temp_dir();
    const auto again = sdtest::run({sdtest::cli(), "--model", tiny(), "--from-png", png, "--outdir", out, "--quiet",
                                    "--threads", "1"});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(sdtest::read_text(sdtest::lines(again.out).at(0)), sdtest::read_text(png));
    const auto off = sdtest::run({sdtest::cli(), "--model", tiny(), "--from-png", png, "--outdir", sdtest::temp_dir(),
                                  "--quiet", "--threads", "1", "--clip-skip", "1"});
    ASSERT_EQ(off.exit_code, 0) << off.err;
    EXPECT_NE(sdtest::read_text(sdtest::lines(off.out).at(0)), sdtest::read_text(png));
}

// A model exported before this change (a text encoder without the clip_skip attribute, made
// here by scripting the same network under an old-style forward) still runs, and clip skip
// or an embedding is refused in one line that says to re-export.
TEST(TextAddonsCli, OldExportRefusedWithOneLine) {
    const std::string m = sdtest::temp_dir() + "/old";
    fs::copy(tiny(), m);
    const std::string code =
        "import sys, torch\n"
        "from sd_export.stages import load_stage, save_stage\n"
        "te = load_stage(sys.argv[1] + '/text_encoder.pt')\n"
        "class Old(torch.nn.Module):\n"
        "    def __init__(self, tm):\n"
        "        super().__init__()\n"
        "        self.text_model = tm\n"
        "    def forward(self, ids: torch.Tensor) -> torch.Tensor:\n"
        "        return self.text_model(ids, 0)\n"
        "Old.__module__, Old.__name__, Old.__qualname__ = 'sd_modules', 'TextEncoder', 'TextEncoder'  # the export's class name\n"
        "from sd_export.modules import TextEncoder\n"
        "new = TextEncoder(49408, 77, 32, 2, 2, 128)\n"
        "new.load_state_dict({n: p for n, p in te.named_parameters()})\n"
        "old = torch.jit.script(Old(new.text_model))\n"
        "save_stage(old, sys.argv[1] + '/text_encoder.pt', sys.argv[1] + '/text_encoder.weights')\n";
    const std::string script = sdtest::temp_dir() + "/old_export.py";  // a file: TorchScript reads the class's source
    sdtest::write_text(script, code);
    const auto made = sdtest::run({"/usr/bin/env", "PYTHONPATH=" + sdtest::env("SD_SOURCE_DIR") + "/python",
                                   sdtest::env("SD_PYTHON"), script, m});
    ASSERT_EQ(made.exit_code, 0) << made.err;
    EXPECT_EQ(sdtest::run(quick_args(m, "a cat")).exit_code, 0);  // still a working model
    auto skip = quick_args(m, "a cat");
    skip.insert(skip.end(), {"--clip-skip", "2"});
    expect_refused(sdtest::run(skip), "re-export the model with this version");
    auto emb = quick_args(m, "a photo of embone");
    emb.insert(emb.end(), {"--embedding", emb_dir() + "/embone.safetensors"});
    expect_refused(sdtest::run(emb), "re-export the model with this version");
}

// ---- textual inversion ----

// The vectors read from each file are the fixture's (added_token_embeddings.npy, in id order),
// and the triggers are the file name (A1111) or the key (diffusers).
TEST(EmbeddingsStage, FilesReadAsTheReference) {
    c10::InferenceMode guard;
    for (const auto& name : kEmbeddingCases) {
        const auto e = sd::load_embeddings(case_embedding_files(name), 32, 75);
        ASSERT_EQ(e.size(), 1u);
        const auto added = sdtest::read_json(emb_case(name) + "/args.json")["added_tokens"];
        EXPECT_EQ(e[0].trigger, added.begin().key()) << name;
        EXPECT_TRUE(at::equal(e[0].vectors, sdtest::load_tensor(emb_case(name) + "/added_token_embeddings.npy"))) << name;
    }
}

// Token ids: the non-added ids exact and the added tokens at the reference's positions;
// then the conditioning (vectors in place of token embeddings, positions, layers and
// final LayerNorm as usual) against cond.npy and uncond.npy.
TEST(EmbeddingsStage, TokensAndCondMatchEveryCase) {
    c10::InferenceMode guard;
    auto te = text_encoder();
    const auto config = sd::load_model_config(tiny());
    for (const auto& name : kEmbeddingCases) {
        SCOPED_TRACE(name);
        const auto a = sdtest::read_json(emb_case(name) + "/args.json");
        const auto embeddings = sd::load_embeddings(case_embedding_files(name), 32, 75);
        const auto added = sd::added_words(embeddings, 49408);
        const auto chunks = sd::tokenize_prompt(sdtest::clip(), a["prompt"].get<std::string>(), {}, 77, 49406, 49407,
                                                49407, added);
        ASSERT_EQ(chunks.ids.size(), 1u);
        const at::Tensor ref = sdtest::load_tensor(emb_case(name) + "/tokens.npy")[0];
        int added_positions = 0;
        for (int64_t i = 0; i < 77; ++i) {
            const int64_t want = ref[i].item<int64_t>(), got = chunks.ids[0][i];
            if (want >= 49408) {
                EXPECT_GE(got, 49408) << "position " << i;
                ++added_positions;
            } else {
                EXPECT_EQ(got, want) << "position " << i;
            }
        }
        EXPECT_EQ(added_positions, embeddings[0].vectors.size(0));
        const auto c = condition(te, a["prompt"].get<std::string>(), 0, embeddings);
        EXPECT_LE(max_diff(c.cond[0], sdtest::load_tensor(emb_case(name) + "/cond.npy")[0]), 1e-4);
        EXPECT_LE(max_diff(c.uncond[0], sdtest::load_tensor(emb_case(name) + "/uncond.npy")[0]), 1e-4);
        // the must-FAIL variation: the embedding not loaded
        const auto without = condition(te, a["prompt"].get<std::string>(), 0, {});
        EXPECT_GT(max_diff(without.cond[0], sdtest::load_tensor(emb_case(name) + "/cond.npy")[0]), 1e-2);
    }
}

// A1111 weighting applies to all n positions of an embedding: "(embthree:1.2)" is the
// plain prompt's encoding with weight 1.2 on the three vectors' positions (A1111's emphasis).
TEST(EmbeddingsStage, WeightAppliesToEveryVector) {
    c10::InferenceMode guard;
    auto te = text_encoder();
    const auto embeddings = sd::load_embeddings({emb_dir() + "/embthree.safetensors"}, 32, 75);
    const auto plain = condition(te, "embthree, a painting of a house", 0, embeddings);
    const auto weighted = condition(te, "(embthree:1.2), a painting of a house", 0, embeddings);
    std::vector<float> w(77, 1.0f);
    w[1] = w[2] = w[3] = 1.2f;
    EXPECT_LE(max_diff(weighted.cond[0], sd::apply_weights(plain.cond[0], w)), 1e-6);
    EXPECT_GT(max_diff(weighted.cond[0], plain.cond[0]), 1e-3);
}

// A long prompt: the embedding that would straddle the 75-token boundary starts the second
// window whole (as A1111), encoded there exactly as at the start of a prompt of its own.
TEST(EmbeddingsStage, LongPromptKeepsAnEmbeddingInOneWindow) {
    c10::InferenceMode guard;
    auto te = text_encoder();
    const auto embeddings = sd::load_embeddings({emb_dir() + "/embthree.safetensors"}, 32, 75);
    const auto c = condition(te, sdtest::words(74) + " embthree red", 0, embeddings);
    ASSERT_EQ(c.cond.size(1), 154);
    const auto second = condition(te, "embthree red", 0, embeddings);
    EXPECT_LE(max_diff(c.cond[0].slice(0, 77, 154), second.cond[0]), 1e-5);  // other batch rows: other rounding
}

// The three public cases through the CLI; the PNG records "TI hashes" (A1111's short hash,
// the first 10 hex digits of the file's SHA-256).
TEST(EmbeddingsCli, PublicCasesMatch) {
    for (const auto& name : kEmbeddingCases) {
        std::vector<std::string> extra = {"--threads", "1"};
        for (const auto& f : case_embedding_files(name)) extra.insert(extra.end(), {"--embedding", f});
        const auto run = sdtest::run_diffusers_case(emb_case(name), tiny(), extra);
        EXPECT_TRUE(run.matches()) << name << ": " << run.describe();
        EXPECT_NE(run.parameters.find(", TI hashes: \""), std::string::npos) << run.parameters;
    }
}

// The README's must-FAIL variation: the embedding not loaded (its trigger is then plain text).
TEST(EmbeddingsCli, EmbeddingNotLoadedFails) {
    const auto run = sdtest::run_diffusers_case(emb_case("e_three_safetensors_ddim10_64x96"), tiny(), {"--threads", "1"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_FALSE(run.matches()) << run.describe();
    EXPECT_EQ(run.parameters.find("TI hashes"), std::string::npos);
}

// --embeddings-dir loads every embedding file of a folder (and its subfolders); the
// prompt's one is used, and only it is named in "TI hashes".
TEST(EmbeddingsCli, EmbeddingsDirLoadsEveryFile) {
    const std::string dir = sdtest::temp_dir() + "/embeddings";
    fs::create_directories(dir + "/sub");
    fs::copy_file(emb_dir() + "/embthree.safetensors", dir + "/embthree.safetensors");
    fs::copy_file(emb_dir() + "/learned_embeds.safetensors", dir + "/sub/learned_embeds.safetensors");
    sdtest::write_text(dir + "/notes.txt", "not an embedding");
    const auto run = sdtest::run_diffusers_case(emb_case("e_three_safetensors_ddim10_64x96"), tiny(),
                                                {"--threads", "1", "--embeddings-dir", dir});
    EXPECT_TRUE(run.matches()) << run.describe();
    EXPECT_NE(run.parameters.find("TI hashes: \"embthree: "), std::string::npos) << run.parameters;
    EXPECT_EQ(run.parameters.find("tiny-cat"), std::string::npos) << run.parameters;
}

// Bad embeddings: one line naming the file (or folder) and the fault, exit 1, no image.
TEST(EmbeddingsCli, BadInputRefusedInOneLine) {
    const std::string dir = sdtest::temp_dir();
    write_embedding(dir + "/narrow.safetensors", 2, 16);
    const std::string whole = sdtest::read_text(emb_dir() + "/embthree.safetensors");
    sdtest::write_text(dir + "/cut.safetensors", whole.substr(0, whole.size() / 2));
    sdtest::write_text(dir + "/garbage.safetensors", "this is not a safetensors file at all");
    const std::string bad_header = std::string("\x10\0\0\0\0\0\0\0", 8) + "{\"x\":{\"dtype\":\"I8\"}}";
    sdtest::write_text(dir + "/odd.safetensors", bad_header);
    fs::create_directories(dir + "/a");
    write_embedding(dir + "/a/twin.safetensors", 1, 32);
    fs::create_directories(dir + "/b");
    write_embedding(dir + "/b/twin.safetensors", 1, 32);
    const std::string pt = sdtest::read_text(emb_dir() + "/embthree.pt");
    sdtest::write_text(dir + "/cut.pt", pt.substr(0, pt.size() * 2 / 3));
    sdtest::write_text(dir + "/garbage.pt", "PK\x03\x04 not really a zip archive");
    sdtest::write_text(dir + "/huge.safetensors", "");
    fs::resize_file(dir + "/huge.safetensors", 100u << 20);  // sparse: a model given by mistake
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--embedding", dir + "/narrow.safetensors"}, "has vectors of width 16, but this model's text encoder has width 32"},
        {{"--embedding", dir + "/cut.safetensors"}, dir + "/cut.safetensors"},
        {{"--embedding", dir + "/garbage.safetensors"}, dir + "/garbage.safetensors"},
        {{"--embedding", dir + "/odd.safetensors"}, dir + "/odd.safetensors"},
        {{"--embedding", dir + "/cut.pt"}, dir + "/cut.pt"},
        {{"--embedding", dir + "/garbage.pt"}, dir + "/garbage.pt"},
        {{"--embedding", dir + "/huge.safetensors"}, "is 100 MiB: far larger than a textual-inversion embedding"},
        {{"--embedding", dir + "/missing.safetensors"}, "--embedding " + dir + "/missing.safetensors: no such file"},
        {{"--embedding", dir + "/notes.txt"}, dir + "/notes.txt"},
        {{"--embeddings-dir", dir + "/nowhere"}, "--embeddings-dir " + dir + "/nowhere: no such folder"},
        {{"--embedding", dir + "/a/twin.safetensors", "--embedding", dir + "/b/twin.safetensors"}, "both have the trigger word \"twin\""},
    };
    sdtest::write_text(dir + "/notes.txt", "text");  // not an embedding file's extension
    for (const auto& [flags, what] : cases) {
        auto args = quick_args(tiny(), "a photo of narrow");
        args.insert(args.end(), flags.begin(), flags.end());
        expect_refused(sdtest::run(args), what);
    }
}

// diffusers' learned_embeds.bin (torch.save of {token: vector}) reads as its .safetensors twin.
TEST(EmbeddingsCli, DiffusersBinFormat) {
    const std::string bin = sdtest::temp_dir() + "/learned_embeds.bin";
    const std::string code = "import sys, numpy, torch\n"
                             "v = torch.from_numpy(numpy.load(sys.argv[1]))[0]\n"
                             "torch.save({'<tiny-cat>': v}, sys.argv[2])\n";
    const auto made = sdtest::run({sdtest::env("SD_PYTHON"), "-c", code, emb_dir() + "/vectors_tiny-cat.npy", bin});
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const auto run = sdtest::run_diffusers_case(emb_case("e_diffusers_ddim10_64x64"), tiny(),
                                                {"--threads", "1", "--embedding", bin});
    EXPECT_TRUE(run.matches()) << run.describe();
}

// Through the CLI: a weighted embedding in a long prompt, and one in the negative prompt.
// The weight changes the image, and "TI hashes" names both embeddings.
TEST(EmbeddingsCli, WeightedInLongPromptAndNegative) {
    const std::string prompt = sdtest::words(74) + " (embthree:1.3) red";
    auto image_for = [&](const std::string& p) {
        auto args = quick_args(tiny(), p);
        args.insert(args.end(), {"--negative-prompt", "blurry, embone", "--embedding", emb_dir() + "/embthree.safetensors",
                                 "--embedding", emb_dir() + "/embone.pt"});
        const auto r = sdtest::run(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return sdtest::lines(r.out).at(0);
    };
    const std::string weighted = image_for(prompt), plain = image_for(sdtest::words(74) + " embthree red");
    EXPECT_NE(sdtest::read_text(weighted), sdtest::read_text(plain));
    const std::string bytes = sdtest::read_text(weighted);
    const std::string text = sd::png_read_text(std::vector<uint8_t>(bytes.begin(), bytes.end()))["parameters"];
    EXPECT_NE(text.find("TI hashes: \"embthree: "), std::string::npos) << text;
    EXPECT_NE(text.find(", embone: "), std::string::npos) << text;
}

// --from-png with the embedding loaded remakes the same PNG; without it, a note says
// which embedding the image used (and the remake differs).
TEST(EmbeddingsCli, FromPngNamesAMissingEmbedding) {
    auto args = quick_args(tiny(), "a photo of embone on a beach");
    args.insert(args.end(), {"--embedding", emb_dir() + "/embone.safetensors"});
    const auto first = sdtest::run(args);
    ASSERT_EQ(first.exit_code, 0) << first.err;
    const std::string png = sdtest::lines(first.out).at(0);
    auto remake = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = {sdtest::cli(), "--model", tiny(), "--from-png", png, "--outdir", sdtest::temp_dir(),
                                      "--threads", "1"};
        a.insert(a.end(), extra.begin(), extra.end());
        return sdtest::run(a);
    };
    const auto with = remake({"--embedding", emb_dir() + "/embone.safetensors", "--quiet"});
    ASSERT_EQ(with.exit_code, 0) << with.err;
    EXPECT_EQ(sdtest::read_text(sdtest::lines(with.out).at(0)), sdtest::read_text(png));
    const auto without = remake({});
    ASSERT_EQ(without.exit_code, 0) << without.err;
    EXPECT_NE(without.err.find("was made with the embedding \"embone\", which is not loaded"), std::string::npos)
        << without.err;
    EXPECT_NE(sdtest::read_text(sdtest::lines(without.out).at(0)), sdtest::read_text(png));
}
