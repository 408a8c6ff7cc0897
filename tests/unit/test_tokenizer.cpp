// Tests of the CLIP tokenizer (include/sd/tokenizer.h, src/text/tokenizer.cpp) and its prompt clean-up
// (src/text/text_clean.*) against the reference fixtures and reference-made data.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sd/error.h"
#include "text/text_clean.h"
#include "sd/tokenizer.h"
#include "test_util.h"

#ifndef SD_TOKENIZER_FIXTURE_DIR
#error "SD_TOKENIZER_FIXTURE_DIR must name tests/fixtures/tokenizer"
#endif
#ifndef SD_CLIP_MODEL_DIR
#error "SD_CLIP_MODEL_DIR must name models/clip"
#endif
#ifndef SD_TEST_DATA_DIR
#error "SD_TEST_DATA_DIR must name tests/data"
#endif
#ifndef SD_SHARED_CONFORMANCE_DIR
#error "SD_SHARED_CONFORMANCE_DIR must name shared/conformance (it may be absent)"
#endif

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kFixtures = SD_TOKENIZER_FIXTURE_DIR;
const std::string kModel = SD_CLIP_MODEL_DIR;
const std::string kData = SD_TEST_DATA_DIR;
const std::string kVocab = kModel + "/vocab.json";
const std::string kMerges = kModel + "/merges.txt";
constexpr int64_t kBos = 49406, kEos = 49407;

const sd::ClipTokenizer& tokenizer() {
    static const sd::ClipTokenizer tok = sd::ClipTokenizer::load(kVocab, kMerges);
    return tok;
}

std::vector<json> read_jsonl(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in) << "cannot open " << path;
    std::vector<json> out;
    for (std::string line; std::getline(in, line);)
        if (!line.empty()) out.push_back(json::parse(line));
    return out;
}

// A prompt as a one-line JSON string (escapes controls and non-ASCII).
std::string quoted(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

template <class T>
std::string str(const std::vector<T>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

std::vector<int64_t> padded(std::vector<int64_t> ids) {
    ids.insert(ids.begin(), kBos);
    ids.push_back(kEos);
    ids.resize(77, kEos);
    return ids;
}

// ------------------------------------------------------------ fixtures

// Every case of the reference fixtures, all 77 ids exact. `ids_hf` (HF
// CLIPTokenizer: no html.unescape of its own) wins where a case has it.
TEST(TokenizerConformance, AllFixtureCasesExact) {
    const auto cases = read_jsonl(kFixtures + "/cases.jsonl");
    ASSERT_GT(cases.size(), 200u);
    std::map<std::string, std::pair<int, int>> by_group;  // group -> (passed, total)
    auto t0 = std::chrono::steady_clock::now();
    for (const json& c : cases) {
        const std::string prompt = c.at("prompt");
        const auto expected = c.contains("ids_hf") ? c.at("ids_hf").get<std::vector<int64_t>>()
                                                   : c.at("ids").get<std::vector<int64_t>>();
        const auto got = tokenizer().encode_padded(prompt);
        // n_tokens counts openai's ids, so it only applies where there is no ids_hf.
        const size_t n_tokens = tokenizer().encode(prompt).size();
        bool ok = got == expected && (c.contains("ids_hf") || n_tokens == c.at("n_tokens").get<size_t>());
        std::vector<std::string> groups = {"category:" + c.at("category").get<std::string>()};
        for (const auto& f : c.at("flags")) groups.push_back("flag:" + f.get<std::string>());
        if (c.at("flags").empty()) groups.push_back("flag:(none)");
        for (const auto& g : groups) {
            by_group[g].first += ok;
            by_group[g].second += 1;
        }
        if (!ok) {
            ADD_FAILURE() << c.at("category").get<std::string>() << " " << c.at("flags").dump() << " prompt "
                          << quoted(prompt) << "\n  expected " << str(expected) << "\n  got      " << str(got)
                          << "\n  n_tokens expected " << c.at("n_tokens") << " got " << n_tokens;
        }
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "[ summary  ] " << cases.size() << " cases in " << ms << " ms\n";
    for (const auto& [g, pt] : by_group)
        std::cout << "[ summary  ] " << g << ": " << pt.first << "/" << pt.second << " pass\n";
}

TEST(TokenizerConformance, EmptyPromptIsBosThenEos) {
    std::vector<int64_t> expected(77, kEos);
    expected[0] = kBos;
    EXPECT_EQ(tokenizer().encode_padded(""), expected);
    EXPECT_EQ(tokenizer().encode_padded("  \n\t "), expected);
    EXPECT_TRUE(tokenizer().encode("").empty());
}

TEST(TokenizerConformance, TruncationBoundary) {
    const int64_t cat = 2368;  // "cat</w>"
    for (int n : {0, 1, 74, 75, 76, 77, 200}) {
        std::string prompt;
        for (int i = 0; i < n; ++i) prompt += i ? " cat" : "cat";
        ASSERT_EQ(tokenizer().encode(prompt).size(), static_cast<size_t>(n));
        const auto ids = tokenizer().encode_padded(prompt);
        ASSERT_EQ(ids.size(), 77u);
        const int kept = std::min(n, 75);
        EXPECT_EQ(ids[0], kBos);
        for (int i = 1; i <= kept; ++i) EXPECT_EQ(ids[i], cat) << "n=" << n << " i=" << i;
        for (int i = kept + 1; i < 77; ++i) EXPECT_EQ(ids[i], kEos) << "n=" << n << " i=" << i;
    }
    // Other lengths and special ids (SD 2.x pads with 0).
    EXPECT_EQ(tokenizer().encode_padded("cat cat cat", 4, 1, 2, 0), (std::vector<int64_t>{1, cat, cat, 2}));
    EXPECT_EQ(tokenizer().encode_padded("cat", 5, 1, 2, 0), (std::vector<int64_t>{1, cat, 2, 0, 0}));
    EXPECT_EQ(tokenizer().encode_padded("cat", 2), (std::vector<int64_t>{kBos, kEos}));
    EXPECT_THROW(tokenizer().encode_padded("cat", 1), sd::Error);
}

TEST(TokenizerConformance, SpecialTokenText) {
    EXPECT_EQ(tokenizer().encode("<|startoftext|>"), std::vector<int>{49406});
    EXPECT_EQ(tokenizer().encode("<|ENDOFTEXT|>"), std::vector<int>{49407});  // lower-cased first
    EXPECT_EQ(tokenizer().encode("a <|endoftext|> b"), (std::vector<int>{320, 49407, 321}));
    // Inside a punctuation run the special text is ordinary text (as in the reference).
    EXPECT_EQ(tokenizer().encode("!<|endoftext|>"), (std::vector<int>{0, 27, 347, 40786, 4160, 91, 285}));
}

// Prompts made by the reference (openai CLIP BPE, ftfy 6.3.1, HF clean-up):
// mojibake in ten code pages, HTML entities, controls, contractions...
TEST(TokenizerConformance, ReferenceExtraCases) {
    const auto cases = read_jsonl(kData + "/tokenizer_extra_cases.jsonl");
    ASSERT_GE(cases.size(), 500u);
    int failed = 0;
    for (const json& c : cases) {
        const std::string prompt = c.at("prompt");
        const auto expected = c.at("ids").get<std::vector<int>>();
        const auto got = tokenizer().encode(prompt);
        if (got != expected && ++failed <= 20)
            ADD_FAILURE() << "prompt " << quoted(prompt) << "\n  expected " << str(expected) << "\n  got      "
                          << str(got);
    }
    EXPECT_EQ(failed, 0);
}

// ------------------------------------------------------------ BPE

struct Word {
    int id;
    std::string text;
};

std::vector<Word> read_words() {
    std::vector<Word> words;
    std::ifstream in(kData + "/clip_words.tsv", std::ios::binary);
    for (std::string line; std::getline(in, line);) {
        size_t tab = line.find('\t');
        if (tab != std::string::npos) words.push_back({std::stoi(line.substr(0, tab)), line.substr(tab + 1)});
    }
    return words;
}

// Whole-word vocabulary entries encode to their own single id: an
// independent check of the merge order over thousands of words.
TEST(TokenizerBpe, VocabularyWordsAreSingleTokens) {
    const auto words = read_words();
    ASSERT_GE(words.size(), 5000u);
    int failed = 0;
    for (const Word& w : words) {
        const auto got = tokenizer().encode(w.text);
        if (got != std::vector<int>{w.id} && ++failed <= 20)
            ADD_FAILURE() << "word " << quoted(w.text) << " expected [" << w.id << "] got " << str(got);
    }
    EXPECT_EQ(failed, 0) << "of " << words.size() << " words";
}

TEST(TokenizerBpe, WordSequencesConcatenate) {
    const auto words = read_words();
    ASSERT_FALSE(words.empty());
    std::mt19937 rng(1234);
    std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
    int failed = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        const int n = 2 + trial % 2;
        std::string prompt;
        std::vector<int> expected;
        for (int k = 0; k < n; ++k) {
            const Word& w = words[pick(rng)];
            prompt += (k ? " " : "") + w.text;
            expected.push_back(w.id);
        }
        if (tokenizer().encode(prompt) != expected && ++failed <= 20)
            ADD_FAILURE() << "prompt " << quoted(prompt) << " expected " << str(expected) << " got "
                          << str(tokenizer().encode(prompt));
    }
    EXPECT_EQ(failed, 0);
}

TEST(TokenizerBpe, SameResultsFromSeveralThreads) {
    const auto words = read_words();
    std::vector<std::string> prompts;
    for (size_t i = 0; i + 2 < words.size() && prompts.size() < 400; i += 7)
        prompts.push_back(words[i].text + " " + words[i + 1].text + ", " + words[i + 2].text + "!");
    std::vector<std::vector<int>> expected;
    for (const auto& p : prompts) expected.push_back(tokenizer().encode(p));
    std::vector<int> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (size_t i = 0; i < prompts.size(); ++i)
                mismatches[t] += tokenizer().encode(prompts[(i * 31 + t) % prompts.size()]) !=
                                 expected[(i * 31 + t) % prompts.size()];
        });
    for (auto& th : threads) th.join();
    for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(TokenizerBpe, MovedTokenizerStillWorks) {
    sd::ClipTokenizer a = sd::ClipTokenizer::load(kVocab, kMerges);
    sd::ClipTokenizer b = std::move(a);
    EXPECT_EQ(b.encode("a photo of a cat"), tokenizer().encode("a photo of a cat"));
}

// ------------------------------------------------------------ clean-up

TEST(TokenizerCleanup, Examples) {
    auto clean = [](const std::string& s) { return sd::u32_to_utf8(sd::clean_prompt(s)); };
    EXPECT_EQ(clean("caf\xC3\x83\xC2\xA9"), "caf\xC3\xA9");                       // cafÃ© -> café
    EXPECT_EQ(clean("\xE2\x80\x9Chi\xE2\x80\x9D don\xE2\x80\x99t"), "\"hi\" don't");  // curly quotes
    EXPECT_EQ(clean("\xEF\xAC\x81re"), "fire");                                     // ligature
    EXPECT_EQ(clean("\xEF\xBC\xAC\xEF\xBC\xAF\xE3\x80\x80X"), "lo x");              // full width
    EXPECT_EQ(clean("tom &amp; jerry &lt;3"), "tom & jerry <3");
    EXPECT_EQ(clean("<b>bold</b> &amp; more"), "<b>bold</b> &amp; more");  // a '<': no unescaping
    EXPECT_EQ(clean("&EACUTE;&SZLIG;"), "\xC3\xA9ss");
    EXPECT_EQ(clean("\x1B[31mred\x1B[0m text"), "red text");
    EXPECT_EQ(clean("bell\x07" "char  \r\n x"), "bellchar x");
    EXPECT_EQ(clean("\xCE\xA3\xCE\x8A\xCE\xA3"), "\xCF\x83\xCE\xAF\xCF\x82");  // ΣΊΣ -> σίς (final sigma)
    EXPECT_EQ(clean("\xC4\xB0"), "i\xCC\x87");                                // İ -> i + dot above
}

// ftfy's mojibake heuristic and fixer (expected values from ftfy 6.3.1).
TEST(TokenizerCleanup, Mojibake) {
    auto u = [](const std::string& s) { return sd::utf8_to_u32(s); };
    auto fix = [&](const std::string& s) { return sd::u32_to_utf8(sd::detail::fix_encoding(u(s))); };
    EXPECT_TRUE(sd::detail::is_bad(u("caf\xC3\x83\xC2\xA9")));   // cafÃ©
    EXPECT_FALSE(sd::detail::is_bad(u("caf\xC3\xA9")));          // café
    EXPECT_FALSE(sd::detail::is_bad(u("\xC3\x83\xC2\xA5")));     // Ã¥ alone does not look bad...
    EXPECT_TRUE(sd::detail::is_bad(u("h\xC3\x83\xC2\xA5r")));    // ...but hÃ¥r does
    EXPECT_EQ(fix("h\xC3\x83\xC2\xA5r"), "h\xC3\xA5r");
    EXPECT_EQ(fix("voil\xC3\x83 le travail"), "voil\xC3\xA0 le travail");  // A0 that became a space
    EXPECT_EQ(fix("\xC3\xA2\xE2\x82\xAC\xC5\x93quoted\xC3\xA2\xE2\x82\xAC\xC2\x9D"),
              "\xE2\x80\x9Cquoted\xE2\x80\x9D");  // â€œquotedâ€
    // An emoji read as Windows-1252.
    EXPECT_EQ(fix("\xC3\xB0\xC5\xB8\xCB\x9C\xE2\x82\xAC emoji"), "\xF0\x9F\x98\x80 emoji");
    // Russian read as Windows-1251.
    EXPECT_EQ(fix("\xD0\xA0\xD1\x97\xD0\xA1\xD0\x82\xD0\xA0\xD1\x91"
                  "\xD0\xA0\xD0\x86\xD0\xA0\xC2\xB5\xD0\xA1\xE2\x80\x9A"),
              "\xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82");
}

// Ill-formed UTF-8 is read as U+FFFD, one per maximal ill-formed subpart
// (Python's errors="replace"); it never throws or crashes.
TEST(TokenizerCleanup, InvalidUtf8BecomesReplacementCharacters) {
    const std::string r = "\xEF\xBF\xBD";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"a\xFF" "b", "a" + r + "b"},
        {"caf\xC3", "caf" + r},
        {"\xED\xA0\x80", r + r + r},  // surrogate
        {"\xC0\xAF", r + r},          // overlong
        {"\xF0\x9F\x90", r},          // truncated
        {"\xE2\x82\xE2\x82\xAC", r + "\xE2\x82\xAC"},
        {"\xF4\x90\x80\x80", r + r + r + r},  // above U+10FFFF
    };
    for (const auto& [bad, good] : cases) {
        EXPECT_EQ(sd::u32_to_utf8(sd::utf8_to_u32(bad)), good) << quoted(bad);
        EXPECT_EQ(tokenizer().encode(bad), tokenizer().encode(good)) << quoted(bad);
    }
    std::mt19937 rng(7);
    for (int trial = 0; trial < 2000; ++trial) {
        std::string bytes(rng() % 40, '\0');
        for (char& ch : bytes) ch = static_cast<char>(rng() % 256);
        const auto ids = tokenizer().encode_padded(bytes);
        ASSERT_EQ(ids.size(), 77u);
        ASSERT_EQ(ids[0], kBos);
    }
}

// ------------------------------------------------------------ bad files

class TokenizerFiles : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("sd_tok_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                std::to_string(std::random_device{}()));
        fs::create_directories(dir_);
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    std::string write(const std::string& name, const std::string& content) {
        const std::string path = (dir_ / name).string();
        std::ofstream(path, std::ios::binary) << content;
        return path;
    }
    // Loading must throw sd::Error with one line that names the bad file.
    void expect_error(const std::string& vocab, const std::string& merges, const std::string& bad_path) {
        try {
            sd::ClipTokenizer::load(vocab, merges);
            ADD_FAILURE() << "no error for " << bad_path;
        } catch (const sd::Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(bad_path), std::string::npos) << msg;
            EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        } catch (const std::exception& e) {
            ADD_FAILURE() << "not an sd::Error: " << e.what();
        }
    }
    // Loading either works or throws sd::Error.
    void expect_no_crash(const std::string& vocab, const std::string& merges) {
        try {
            sd::ClipTokenizer tok = sd::ClipTokenizer::load(vocab, merges);
            (void)tok.encode_padded("a photo of a cat, caf\xC3\xA9 \xF0\x9F\x90\xB1");
        } catch (const sd::Error&) {
        } catch (const std::exception& e) {
            ADD_FAILURE() << "not an sd::Error: " << e.what();
        }
    }
    fs::path dir_;
};

TEST_F(TokenizerFiles, BadVocabularyThrows) {
    const std::string missing = (dir_ / "missing.json").string();
    expect_error(missing, kMerges, missing);
    expect_error(dir_.string(), kMerges, dir_.string());  // a directory
    const std::string vocab = sdtest::read_text(kVocab);
    const std::vector<std::string> bad = {
        "",
        "   ",
        "not json at all",
        vocab.substr(0, vocab.size() / 2),  // truncated
        vocab + "garbage",
        "[1, 2, 3]",
        "{\"a\": {\"b\": 1}}",
        "{\"a\": \"1\"}",
        "{\"a\": 1.5}",
        "{\"a\": -1}",
        "{\"a\": 99999999999}",
        "{\"a\": 1, \"b\": 1}",            // same id twice
        "{\"a\": 1, \"a\": 2}",            // same token twice
        "{\"a\": 1, \"b\": 2}",            // valid JSON, not a CLIP vocabulary
        std::string("{\"\xFF\xFE\": 1}"),  // invalid UTF-8
        std::string("\x00\x01\x02\xFF\x89PNG\r\n", 11),
        std::string(100000, '['),  // deep nesting
        "{}",
        "42",
    };
    for (size_t i = 0; i < bad.size(); ++i) {
        const std::string path = write("vocab" + std::to_string(i) + ".json", bad[i]);
        expect_error(path, kMerges, path);
    }
    // Without the special tokens.
    json j = json::parse(vocab);
    j.erase("<|endoftext|>");
    const std::string path = write("nospecial.json", j.dump());
    expect_error(path, kMerges, path);
}

TEST_F(TokenizerFiles, BadMergesThrows) {
    const std::string missing = (dir_ / "missing.txt").string();
    expect_error(kVocab, missing, missing);
    expect_error(kVocab, dir_.string(), dir_.string());
    const std::vector<std::string> bad = {
        "",
        "#version: 0.2\n",
        "#version: 0.2\ni n\nt h\na b c\n",  // three symbols
        "#version: 0.2\ni n\nthe\n",        // one symbol
        "#version: 0.2\ni  n\n",            // two spaces
        "#version: 0.2\ni n\n\nt h\n",      // empty line inside
        "#version: 0.2\nzz\xC3\xA9 qq\n",   // not in the vocabulary
        std::string("\x00\x01 \x02\xFF\x89PNG\r\n", 12),
    };
    for (size_t i = 0; i < bad.size(); ++i) {
        const std::string path = write("merges" + std::to_string(i) + ".txt", bad[i]);
        expect_error(kVocab, path, path);
    }
}

TEST_F(TokenizerFiles, GoodVariantsLoad) {
    // CRLF line ends, no header line, no final newline, blank lines at the end.
    const std::string merges = sdtest::read_text(kMerges);
    std::string crlf;
    for (char c : merges) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
    const std::string no_header = merges.substr(merges.find('\n') + 1);
    const std::string no_newline = merges.substr(0, merges.size() - 1);
    const std::string blank_lines = merges + "\n\r\n\n";
    for (const std::string& m : {crlf, no_header, no_newline, blank_lines}) {
        const std::string path = write("merges.txt", m);
        const auto tok = sd::ClipTokenizer::load(kVocab, path);
        EXPECT_EQ(tok.encode("a photograph of an astronaut riding a horse"),
                  tokenizer().encode("a photograph of an astronaut riding a horse"));
    }
}

TEST_F(TokenizerFiles, TruncatedOrCorruptedFilesNeverCrash) {
    const std::string vocab = sdtest::read_text(kVocab), merges = sdtest::read_text(kMerges);
    std::mt19937 rng(99);
    for (int trial = 0; trial < 12; ++trial) {
        std::string v = vocab, m = merges;
        if (trial % 2) {
            m.resize(rng() % m.size());  // truncated anywhere
        } else {
            for (int k = 0; k < 20; ++k) m[rng() % m.size()] = static_cast<char>(rng() % 256);  // flipped bytes
        }
        if (trial % 3 == 0) v.resize(rng() % v.size());
        expect_no_crash(write("v.json", v), write("m.txt", m));
    }
    std::string random_bytes(4096, '\0');
    for (char& c : random_bytes) c = static_cast<char>(rng() % 256);
    const std::string garbage = write("garbage.bin", random_bytes);
    expect_error(garbage, kMerges, garbage);
    expect_error(kVocab, garbage, garbage);
}

// ------------------------------------------------------------ copies

// The repository's copies of the fixtures and tokenizer files are
// byte-identical to the shared conformance set, where that is present.
TEST(TokenizerCopies, MatchSharedConformanceSet) {
    const std::string shared = std::string(SD_SHARED_CONFORMANCE_DIR) + "/tokenizer";
    if (!fs::is_directory(shared)) GTEST_SKIP() << shared << " is not present";
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {kFixtures + "/cases.jsonl", shared + "/cases.jsonl"},
        {kFixtures + "/meta.json", shared + "/meta.json"},
        {kVocab, shared + "/vocab.json"},
        {kMerges, shared + "/merges.txt"},
    };
    for (const auto& [ours, theirs] : pairs) {
        const std::string a = sdtest::read_text(ours), b = sdtest::read_text(theirs);
        EXPECT_FALSE(a.empty()) << ours;
        EXPECT_TRUE(a == b) << ours << " differs from " << theirs;
    }
}

}  // namespace
