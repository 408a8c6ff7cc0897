// CLIP BPE tokenizer. Same results as openai/CLIP's SimpleTokenizer.encode
// run through HF CLIPTokenizer's clean-up (ftfy, whitespace, lower case; no
// extra html.unescape): see text_clean.h for the clean-up. With open_clip's
// vocabulary (SD 2.x) it is open_clip's tokenizer: html.unescape twice after
// ftfy, and <start_of_text> / <end_of_text> as the special texts.
#include "sd/tokenizer.h"

#include <unicode/uchar.h>

#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "sd/error.h"
#include "text/html_unescape.h"
#include "text/text_clean.h"

namespace sd {
namespace {

constexpr uintmax_t kMaxFileBytes = 64u << 20;  // vocab.json is ~1.6 MB; refuse checkpoints etc.
// The special texts by vocabulary: CLIP / HF (SD 1.x) and open_clip (SD 2.x).
const std::u32string kStartOfText = U"<|startoftext|>";
const std::u32string kEndOfText = U"<|endoftext|>";
const std::u32string kOpenClipStart = U"<start_of_text>";
const std::u32string kOpenClipEnd = U"<end_of_text>";

const char* const kVocabWhat = "CLIP vocabulary";
const char* const kMergesWhat = "CLIP merges file";

// One line that names the file: "CLIP vocabulary 'path': why".
Error file_error(const std::string& what, const std::string& path, const std::string& why) {
    return Error(what + " '" + path + "': " + why);
}

std::string read_file(const std::string& path, const std::string& what) {
    namespace fs = std::filesystem;
    auto fail = [&](const std::string& why) { return file_error(what, path, why); };
    std::error_code ec;
    if (!fs::exists(path, ec)) throw fail("no such file");
    if (fs::is_directory(path, ec)) throw fail("is a directory");
    uintmax_t size = fs::file_size(path, ec);
    if (ec) throw fail("cannot read it (" + ec.message() + ")");
    if (size > kMaxFileBytes) throw fail("too large (" + std::to_string(size) + " bytes)");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw fail("cannot open it");
    std::string data(static_cast<size_t>(size), '\0');
    in.read(data.data(), static_cast<std::streamsize>(size));
    if (static_cast<uintmax_t>(in.gcount()) != size) throw fail("read error");
    return data;
}

// GPT-2's reversible byte -> printable character table: printable Latin-1
// bytes stand for themselves, the others get U+0100 onwards in byte order.
std::array<std::string, 256> byte_symbols() {
    std::array<std::string, 256> sym;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        sym[b] = u32_to_utf8(std::u32string(1, printable ? static_cast<char32_t>(b) : next++));
    }
    return sym;
}

// Reads {token: id} without building a DOM; anything but a flat object of
// non-negative integer ids is rejected.
struct VocabReader : nlohmann::json_sax<nlohmann::json> {
    std::unordered_map<std::string, int> vocab;
    std::string key_, error;
    int depth = 0;

    bool fail(const std::string& why) {
        if (error.empty()) error = why;
        return false;
    }
    bool id(uint64_t v, bool negative) {
        if (depth != 1) return fail("expected a JSON object {token: id}");
        if (negative || v > static_cast<uint64_t>(INT_MAX)) return fail("id out of range");
        if (!vocab.emplace(key_, static_cast<int>(v)).second) return fail("duplicate token");
        return true;
    }
    bool null() override { return fail("ids must be integers"); }
    bool boolean(bool) override { return fail("ids must be integers"); }
    bool number_integer(number_integer_t v) override { return id(static_cast<uint64_t>(v), v < 0); }
    bool number_unsigned(number_unsigned_t v) override { return id(v, false); }
    bool number_float(number_float_t, const string_t&) override { return fail("ids must be integers"); }
    bool string(string_t&) override { return fail("ids must be integers"); }
    bool binary(binary_t&) override { return fail("ids must be integers"); }
    bool start_object(std::size_t) override { return ++depth == 1 || fail("expected a flat JSON object {token: id}"); }
    bool key(string_t& k) override {
        key_ = k;
        return true;
    }
    bool end_object() override {
        --depth;
        return true;
    }
    bool start_array(std::size_t) override { return fail("expected a JSON object {token: id}"); }
    bool end_array() override { return false; }
    bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception&) override {
        return fail("invalid JSON near byte " + std::to_string(pos));
    }
};

bool is_letter(char32_t c) { return c < 0x110000 && (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_L_MASK); }
bool is_number(char32_t c) { return c < 0x110000 && (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK); }

// Matches `pat` at t[i] case-insensitively (simple case folding, as the
// reference regex's IGNORECASE: "'ſ" matches "'s").
bool match_folded(const std::u32string& t, size_t i, std::u32string_view pat) {
    if (i + pat.size() > t.size()) return false;
    for (size_t k = 0; k < pat.size(); ++k)
        if (static_cast<char32_t>(u_foldCase(static_cast<UChar32>(t[i + k]), U_FOLD_CASE_DEFAULT)) != pat[k])
            return false;
    return true;
}

// The reference's pre-tokenizer regex, applied like re.findall:
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// (open_clip: <start_of_text>|<end_of_text> first instead).
// Calls emit(begin, length) for each match; unmatched characters are skipped.
template <class Emit>
void split_words(const std::u32string& t, const std::u32string& start_text, const std::u32string& end_text, Emit emit) {
    static const std::u32string_view contractions[] = {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"};
    // U+0345 (combining ypogegrammeni) case-folds to a letter, so under
    // IGNORECASE it is neither in [\p{L}] nor in the negated class: no match.
    auto other = [](char32_t c) { return !is_py_space(c) && !is_letter(c) && !is_number(c) && c != 0x345; };
    for (size_t i = 0; i < t.size();) {
        size_t len = 0;
        if (match_folded(t, i, start_text)) {
            len = start_text.size();
        } else if (match_folded(t, i, end_text)) {
            len = end_text.size();
        } else if (t[i] == '\'') {
            for (std::u32string_view c : contractions)
                if (match_folded(t, i + 1, c)) {
                    len = 1 + c.size();
                    break;
                }
        }
        if (!len) {
            if (is_letter(t[i])) {
                while (i + len < t.size() && is_letter(t[i + len])) ++len;
            } else if (is_number(t[i])) {
                len = 1;
            } else {
                while (i + len < t.size() && other(t[i + len])) ++len;
            }
        }
        if (len) {
            emit(i, len);
            i += len;
        } else {
            ++i;  // whitespace (only ' ' is left after clean-up) or U+0345
        }
    }
}

}  // namespace

struct ClipTokenizer::Impl {
    struct Merge {
        int rank;
        int id;  // vocab id of the merged symbol
    };
    int byte_id[256];                            // symbol of a byte inside a word
    int byte_end_id[256];                        // symbol of a word's last byte ("x</w>")
    std::unordered_map<uint64_t, Merge> merges;  // (left id, right id) -> merge
    int start_id = 0, end_id = 0;
    std::u32string start_text = kStartOfText, end_text = kEndOfText;
    bool open_clip = false;  // open_clip's clean-up: html.unescape twice after ftfy

    mutable std::mutex mutex;
    mutable std::unordered_map<std::string, std::vector<int>> cache;  // word bytes -> ids

    static uint64_t pair_key(int a, int b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

    // Byte-level BPE of one word: start from one symbol per byte (the last
    // one marked end-of-word), then keep merging the adjacent pair with the
    // lowest rank, all its occurrences left to right, until none has a rank.
    std::vector<int> bpe(const std::string& word) const {
        std::vector<int> sym;
        sym.reserve(word.size());
        for (size_t k = 0; k < word.size(); ++k) {
            auto b = static_cast<unsigned char>(word[k]);
            sym.push_back(k + 1 < word.size() ? byte_id[b] : byte_end_id[b]);
        }
        std::vector<int> next;
        while (sym.size() > 1) {
            const Merge* best = nullptr;
            uint64_t best_key = 0;
            for (size_t k = 0; k + 1 < sym.size(); ++k) {
                auto it = merges.find(pair_key(sym[k], sym[k + 1]));
                if (it != merges.end() && (!best || it->second.rank < best->rank)) {
                    best = &it->second;
                    best_key = it->first;
                }
            }
            if (!best) break;
            next.clear();
            for (size_t k = 0; k < sym.size(); ++k) {
                if (k + 1 < sym.size() && pair_key(sym[k], sym[k + 1]) == best_key) {
                    next.push_back(best->id);
                    ++k;
                } else {
                    next.push_back(sym[k]);
                }
            }
            sym.swap(next);
        }
        return sym;
    }

    void encode_word(const std::u32string& word, std::vector<int>& out) const {
        // The reference emits the special ids only for these exact strings.
        if (word == start_text) {
            out.push_back(start_id);
            return;
        }
        if (word == end_text) {
            out.push_back(end_id);
            return;
        }
        std::string bytes = u32_to_utf8(word);
        std::lock_guard<std::mutex> lock(mutex);
        auto it = cache.find(bytes);
        if (it == cache.end()) {
            if (cache.size() > 100000) cache.clear();  // bound memory on endless distinct input
            it = cache.emplace(bytes, bpe(bytes)).first;
        }
        out.insert(out.end(), it->second.begin(), it->second.end());
    }
};

ClipTokenizer::ClipTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClipTokenizer::ClipTokenizer(ClipTokenizer&&) noexcept = default;
ClipTokenizer& ClipTokenizer::operator=(ClipTokenizer&&) noexcept = default;
ClipTokenizer::~ClipTokenizer() = default;

ClipTokenizer ClipTokenizer::load(const std::string& vocab_json_path, const std::string& merges_txt_path) {
    auto vocab_error = [&](const std::string& why) { return file_error(kVocabWhat, vocab_json_path, why); };
    auto merges_error = [&](const std::string& why) { return file_error(kMergesWhat, merges_txt_path, why); };

    VocabReader reader;
    {
        std::string json = read_file(vocab_json_path, kVocabWhat);
        bool ok = nlohmann::json::sax_parse(json, &reader);
        if (!ok || !reader.error.empty()) throw vocab_error(reader.error.empty() ? "invalid JSON" : reader.error);
    }
    const auto& vocab = reader.vocab;
    if (vocab.empty()) throw vocab_error("no tokens");
    // The BPE works on ids, so distinct tokens need distinct ids.
    std::unordered_set<int> seen;
    for (const auto& kv : vocab)
        if (!seen.insert(kv.second).second) throw vocab_error("id " + std::to_string(kv.second) + " is used twice");
    auto lookup = [&](const std::string& token) {
        auto it = vocab.find(token);
        return it == vocab.end() ? -1 : it->second;
    };

    auto impl = std::make_unique<Impl>();
    const auto symbols = byte_symbols();
    for (int b = 0; b < 256; ++b) {
        impl->byte_id[b] = lookup(symbols[b]);
        impl->byte_end_id[b] = lookup(symbols[b] + "</w>");
        if (impl->byte_id[b] < 0 || impl->byte_end_id[b] < 0)
            throw vocab_error("no symbol for byte " + std::to_string(b) + " (not a CLIP byte-level BPE vocabulary)");
    }
    impl->start_id = lookup("<|startoftext|>");
    impl->end_id = lookup("<|endoftext|>");
    if (impl->start_id < 0 && impl->end_id < 0) {
        impl->start_id = lookup("<start_of_text>");
        impl->end_id = lookup("<end_of_text>");
        impl->start_text = kOpenClipStart;
        impl->end_text = kOpenClipEnd;
        impl->open_clip = true;
    }
    if (impl->start_id < 0 || impl->end_id < 0)
        throw vocab_error("lacks <|startoftext|> and <|endoftext|> (or open_clip's <start_of_text> and <end_of_text>)");

    const std::string text = read_file(merges_txt_path, kMergesWhat);
    int rank = 0;
    size_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        std::string_view line(text.data() + pos, eol - pos);
        pos = eol + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line_no == 1 && !line.empty() && line[0] == '#') continue;  // "#version: 0.2"
        if (line.empty()) {
            if (text.find_first_not_of("\r\n", std::min(pos, text.size())) == std::string::npos) break;
            throw merges_error("empty line " + std::to_string(line_no));
        }
        size_t sp = line.find(' ');
        if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() ||
            line.find(' ', sp + 1) != std::string_view::npos)
            throw merges_error("line " + std::to_string(line_no) + " is not two symbols separated by one space");
        std::string left(line.substr(0, sp)), right(line.substr(sp + 1));
        int a = lookup(left), b = lookup(right), merged = lookup(left + right);
        if (a < 0 || b < 0 || merged < 0)
            throw merges_error("line " + std::to_string(line_no) + " uses a symbol that is not in the vocabulary");
        // A pair listed twice keeps its last rank, as the reference's dict does.
        impl->merges[Impl::pair_key(a, b)] = Impl::Merge{rank++, merged};
    }
    if (rank == 0) throw merges_error("no merges");
    return ClipTokenizer(std::move(impl));
}

std::vector<int> ClipTokenizer::encode(const std::string& utf8_text) const {
    std::u32string text;
    if (impl_->open_clip) {
        text = to_lower(whitespace_clean(html_unescape(html_unescape(fix_text(utf8_to_u32(utf8_text))))));
    } else {
        text = clean_prompt(utf8_text);
    }
    std::vector<int> ids;
    split_words(text, impl_->start_text, impl_->end_text,
                [&](size_t begin, size_t len) { impl_->encode_word(text.substr(begin, len), ids); });
    return ids;
}

bool ClipTokenizer::is_open_clip() const { return impl_->open_clip; }

std::vector<int64_t> ClipTokenizer::encode_padded(const std::string& utf8_text, int context_length, int bos, int eos,
                                                  int pad) const {
    if (context_length < 2) throw Error("context length must be at least 2, got " + std::to_string(context_length));
    std::vector<int> ids = encode(utf8_text);
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(context_length));
    out.push_back(bos);
    size_t keep = std::min(ids.size(), static_cast<size_t>(context_length - 2));
    out.insert(out.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep));
    out.push_back(eos);
    out.resize(static_cast<size_t>(context_length), pad);
    return out;
}

}  // namespace sd
