#include "text/trigger_words.h"

namespace sd {
namespace {

bool is_word_char(char c) {
    auto u = static_cast<unsigned char>(c);
    return (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' || u >= 0x80;
}

// Whether `w` occurs at text[i] as a whole word, in exact case.
bool matches_at(const std::string& text, size_t i, const std::string& w) {
    if (w.empty() || i + w.size() > text.size() || text.compare(i, w.size(), w) != 0) return false;
    const bool glued_before = i > 0 && is_word_char(w.front()) && is_word_char(text[i - 1]);
    const size_t end = i + w.size();
    const bool glued_after = end < text.size() && is_word_char(w.back()) && is_word_char(text[end]);
    return !glued_before && !glued_after;
}

// The longest trigger at text[i], or -1.
int word_at(const std::string& text, size_t i, const std::vector<AddedWord>& words) {
    int best = -1;
    for (size_t k = 0; k < words.size(); ++k)
        if (matches_at(text, i, words[k].trigger) && (best < 0 || words[k].trigger.size() > words[best].trigger.size()))
            best = static_cast<int>(k);
    return best;
}

}  // namespace

std::vector<TextPiece> split_trigger_words(const std::string& text, const std::vector<AddedWord>& words) {
    std::vector<TextPiece> out;
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
        const int w = words.empty() ? -1 : word_at(text, i, words);
        if (w < 0) {
            ++i;
            continue;
        }
        if (i > start) out.push_back({text.substr(start, i - start), -1});
        out.push_back({"", w});
        i += words[w].trigger.size();
        start = i;
    }
    if (start < text.size() || out.empty()) out.push_back({text.substr(start), -1});
    return out;
}

std::vector<int> trigger_words_used(const std::string& text, const std::vector<AddedWord>& words) {
    std::vector<bool> seen(words.size(), false);
    for (const auto& piece : split_trigger_words(text, words))
        if (piece.word >= 0) seen[piece.word] = true;
    std::vector<int> out;
    for (size_t k = 0; k < words.size(); ++k)
        if (seen[k]) out.push_back(static_cast<int>(k));
    return out;
}

}  // namespace sd
