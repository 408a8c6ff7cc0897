// Clip skip and textual inversion without a model: trigger words in prompt text,
// their token positions and weights, embedding file choices, SHA-256, the bounds
// of --clip-skip, and the PNG text ("Clip skip", "TI hashes") written and read back.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/embedding_file.h"
#include "io/sha256.h"
#include "prompt_util.h"
#include "run/batch_plan.h"
#include "sd/error.h"
#include "sd/from_png.h"
#include "sd/value_rules.h"
#include "test_util.h"
#include "text/prompt_weights.h"
#include "text/trigger_words.h"

namespace {

const std::vector<sd::AddedWord> kWords = {{"embone", 49408, 1}, {"embthree", 49409, 3}, {"<tiny-cat>", 49412, 1},
                                           {"emb", 49413, 2}};

// The pieces as "text|#word|text".
std::string pieces(const std::string& text) {
    std::string out;
    for (const auto& p : sd::split_trigger_words(text, kWords))
        out += (out.empty() ? "" : "|") + (p.word >= 0 ? "#" + kWords[p.word].trigger : p.text);
    return out;
}

}  // namespace

TEST(TriggerWords, WholeWordsInExactCase) {
    EXPECT_EQ(pieces("a photo of embone on a beach"), "a photo of |#embone| on a beach");
    EXPECT_EQ(pieces("embone, embthree."), "#embone|, |#embthree|.");
    EXPECT_EQ(pieces("EmbOne, EMBTHREE."), "EmbOne, EMBTHREE.");  // issue 32: case is part of the word
    EXPECT_EQ(pieces("(embone:1.2) red"), "(|#embone|:1.2) red");
    // glued to letters, digits or '_': another word
    EXPECT_EQ(pieces("embones embone2 my_embone"), "embones embone2 my_embone");
    // the longest trigger where several start ("emb" is also loaded)
    EXPECT_EQ(pieces("emb embone"), "#emb| |#embone");
    // a trigger of punctuation and letters, next to other punctuation
    EXPECT_EQ(pieces("a <tiny-cat>, toy"), "a |#<tiny-cat>|, toy");
    EXPECT_EQ(pieces(""), "");
    EXPECT_EQ(pieces("no triggers here"), "no triggers here");
    EXPECT_EQ(sd::trigger_words_used("embthree and embone and embthree", kWords), (std::vector<int>{0, 1}));
    EXPECT_EQ(sd::trigger_words_used("embthree and EMBONE", kWords), (std::vector<int>{1}));
}

// n vectors are n consecutive positions in place of the word, later words move n - 1
// further; with weighting the n positions carry the word's weight.
TEST(TriggerWords, PositionsAndWeights) {
    const auto& tok = sdtest::clip();
    const auto plain = tok.encode("a painting of a house");
    const auto c = sd::tokenize_prompt(tok, "(embthree:1.5), a painting of a house", {}, 77, 49406, 49407, 49407, kWords);
    ASSERT_EQ(c.ids.size(), 1u);
    EXPECT_EQ(c.ids[0][0], 49406);
    EXPECT_EQ(std::vector<int64_t>(c.ids[0].begin() + 1, c.ids[0].begin() + 4), (std::vector<int64_t>{49409, 49410, 49411}));
    EXPECT_EQ(c.ids[0][4], tok.encode(",")[0]);
    for (size_t k = 0; k < plain.size(); ++k) EXPECT_EQ(c.ids[0][5 + k], plain[k]);
    EXPECT_EQ(c.ids[0][5 + plain.size()], 49407);
    for (int i = 1; i <= 3; ++i) EXPECT_FLOAT_EQ(c.weights[0][i], 1.5f);
    EXPECT_FLOAT_EQ(c.weights[0][4], 1.0f);
}

// Long prompts: an embedding that would straddle the 75-token boundary starts the next
// window (A1111); with one window (plain syntax) the cut at 77 comes afterwards (diffusers).
TEST(TriggerWords, LongPromptWindows) {
    const auto& tok = sdtest::clip();
    const std::string text = sdtest::words(74) + " embthree red";
    const auto c = sd::tokenize_prompt(tok, text, {}, 77, 49406, 49407, 49407, kWords);
    ASSERT_EQ(c.ids.size(), 2u);
    EXPECT_EQ(c.ids[0][75], 49407);  // the first window ends after the 74 words
    EXPECT_EQ(std::vector<int64_t>(c.ids[1].begin() + 1, c.ids[1].begin() + 4), (std::vector<int64_t>{49409, 49410, 49411}));
    const auto cut = sd::tokenize_prompt(tok, text, {false, false}, 77, 49406, 49407, 49407, kWords);
    ASSERT_EQ(cut.ids.size(), 1u);
    EXPECT_EQ(cut.ids[0][75], 49409);  // the first vector fits, the rest is cut off with the window
    EXPECT_EQ(cut.ids[0][76], 49407);
}

TEST(EmbeddingFiles, TensorAndTriggerChoice) {
    EXPECT_EQ(sd::embedding_tensor_name({"emb_params"}, "x"), "emb_params");
    EXPECT_EQ(sd::embedding_tensor_name({"string_to_param.*"}, "x"), "string_to_param.*");
    EXPECT_EQ(sd::embedding_tensor_name({"<cat-toy>"}, "x"), "<cat-toy>");
    EXPECT_THROW(sd::embedding_tensor_name({}, "x"), sd::Error);
    try {
        sd::embedding_tensor_name({"clip_g", "clip_l", "extra"}, "/e/three.safetensors");
        FAIL() << "three tensors accepted";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("/e/three.safetensors holds 3 tensors (clip_g, clip_l, extra)"),
                  std::string::npos);
    }
    // A1111's SDXL pair: named as such on SD 1.x and 2.x, taken on SDXL; one tensor is not one there.
    try {
        sd::embedding_tensor_name({"clip_g", "clip_l"}, "/e/sdxl.safetensors");
        FAIL() << "an SDXL pair accepted";
    } catch (const sd::Error& e) {
        EXPECT_EQ(std::string(e.what()),
                  "embedding /e/sdxl.safetensors is an SDXL embedding (clip_l and clip_g); this model is SD 1.x or 2.x");
    }
    EXPECT_EQ(sd::sdxl_embedding_tensor_names({"clip_g", "clip_l"}, "x"), (std::vector<std::string>{"clip_l", "clip_g"}));
    try {
        sd::sdxl_embedding_tensor_names({"emb_params"}, "/e/sd15.pt");
        FAIL() << "one tensor accepted on SDXL";
    } catch (const sd::Error& e) {
        EXPECT_EQ(std::string(e.what()), "embedding /e/sd15.pt is not an SDXL embedding (no clip_l and clip_g tensors; "
                                         "one tensor emb_params: an SD 1.x or 2.x embedding?)");
    }
    EXPECT_EQ(sd::embedding_trigger("/a/xlone.safetensors", "clip_l"), "xlone");
    EXPECT_EQ(sd::embedding_trigger("/a/EasyNegative.safetensors", "emb_params"), "EasyNegative");
    EXPECT_EQ(sd::embedding_trigger("/a/embone.pt", "string_to_param.*"), "embone");
    EXPECT_EQ(sd::embedding_trigger("/a/learned_embeds.safetensors", "<tiny-cat>"), "<tiny-cat>");
}

// Issue 32: a trigger must be typeable as one word of a prompt; two that differ
// only in case are one trigger to the user.
TEST(EmbeddingFiles, TriggersThePromptCannotTypeAreRefused) {
    for (const char* ok : {"embone", "EasyNegative", "<cat-toy>", "bad-hands-5", "caf\u00e9", "ng"})
        EXPECT_NO_THROW(sd::check_trigger_word(ok, "embedding e.pt")) << ok;
    for (const char* bad : {"", " ", "a", "BREAK", "(", ")", "[x]", "x:1", "a b", "tab\tx", "back\\slash"}) {
        try {
            sd::check_trigger_word(bad, "embedding e.pt");
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const sd::Error& e) {
            const std::string m = e.what();
            EXPECT_EQ(m.rfind("embedding e.pt: its trigger word", 0), 0u) << m;
            EXPECT_EQ(m.find('\t'), std::string::npos) << m;  // printed escaped
        }
    }
    EXPECT_TRUE(sd::same_ignoring_case("Emb", "emb"));
    EXPECT_FALSE(sd::same_ignoring_case("emb", "embs"));
}

TEST(EmbeddingFiles, FolderListing) {
    namespace fs = std::filesystem;
    const std::string dir = sdtest::temp_dir();
    fs::create_directories(dir + "/sub");
    for (const char* f : {"/b.safetensors", "/a.pt", "/sub/c.bin", "/readme.txt", "/preview.png"}) sdtest::write_text(dir + f, "x");
    EXPECT_EQ(sd::embedding_files({dir + "/readme.txt"}, dir),
              (std::vector<std::string>{dir + "/readme.txt", dir + "/a.pt", dir + "/b.safetensors", dir + "/sub/c.bin"}));
    EXPECT_THROW(sd::embedding_files({}, dir + "/none"), sd::Error);
    EXPECT_THROW(sd::embedding_files({}, dir + "/a.pt"), sd::Error);      // a file as the folder
    EXPECT_THROW(sd::embedding_files({dir + "/sub"}, ""), sd::Error);     // a folder as the file
    EXPECT_THROW(sd::embedding_files({dir + "/gone.pt"}, ""), sd::Error);
}

// FIPS 180-4's examples: one block, the empty message, and a message spanning two blocks.
TEST(Sha256, KnownDigests) {
    EXPECT_EQ(sd::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sd::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sd::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const std::string f = sdtest::temp_dir() + "/abc";
    sdtest::write_text(f, "abc");
    EXPECT_EQ(sd::embedding_short_hash(f), "ba7816bf8f");
}

TEST(ClipSkip, Bounds) {
    EXPECT_NO_THROW(sd::check_clip_skip("--clip-skip", 1, 12));
    EXPECT_NO_THROW(sd::check_clip_skip("--clip-skip", 13, 12));  // the embeddings alone
    EXPECT_THROW(sd::check_clip_skip("--clip-skip", 14, 12), sd::Error);
    EXPECT_THROW(sd::check_clip_skip("--clip-skip", 0, 12), sd::Error);
    EXPECT_THROW(sd::check_clip_skip("--clip-skip", -3, 0), sd::Error);
    EXPECT_NO_THROW(sd::check_clip_skip("--clip-skip", 50, 0));  // layers not recorded: the flag's own bound only
}

// "Clip skip: N" when N is not 1, and "TI hashes" of the embeddings the prompt or the
// negative prompt uses (quoted, as A1111 writes a value holding ':' and ','); both read back.
TEST(ClipSkip, ParametersTextWrittenAndRead) {
    sd::PromptItem item;
    item.prompt = "a photo of embone";
    item.negative_prompt = "blurry, EasyNegative";
    item.settings.clip_skip = 2;
    sd::PlannedImage img;
    const std::vector<sd::EmbeddingInfo> loaded = {{"embone", "0123456789"}, {"unused", "aaaaaaaaaa"},
                                                   {"EasyNegative", "c74b4e810b"}};
    const std::string text = sd::parameters_text(item, img, sd::SeedMode::per_image, "m", loaded);
    EXPECT_NE(text.find(", Clip skip: 2, TI hashes: \"embone: 0123456789, EasyNegative: c74b4e810b\", "), std::string::npos)
        << text;
    const auto rec = sd::parse_parameters_text(text, "x.png");
    EXPECT_EQ(rec.clip_skip, 2);
    ASSERT_EQ(rec.embeddings.size(), 2u);
    EXPECT_EQ(rec.embeddings[0].name, "embone");
    EXPECT_EQ(rec.embeddings[0].hash, "0123456789");
    EXPECT_EQ(rec.embeddings[1].name, "EasyNegative");
    EXPECT_EQ(rec.embeddings[1].hash, "c74b4e810b");
    EXPECT_EQ(rec.prompt, item.prompt);
    item.settings.clip_skip = 1;
    item.prompt = "a photo";
    item.negative_prompt.clear();
    const std::string off = sd::parameters_text(item, img, sd::SeedMode::per_image, "m", loaded);
    EXPECT_EQ(off.find("Clip skip"), std::string::npos);
    EXPECT_EQ(off.find("TI hashes"), std::string::npos);
    EXPECT_FALSE(sd::parse_parameters_text(off, "x.png").clip_skip);
    EXPECT_THROW(sd::parse_parameters_text("p\nSteps: 20, Clip skip: two", "x.png"), sd::Error);
}
