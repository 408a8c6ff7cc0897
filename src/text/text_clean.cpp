// Port of the prompt clean-up the CLIP reference applies (see text_clean.h).
// The mojibake part follows ftfy 6.3.1 (github.com/rspeer/python-ftfy,
// Apache-2.0) closely: its heuristic and its order of attempts decide which
// prompts get "fixed", and the token ids depend on that.
#include "text/text_clean.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/ucnv.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace sd {
namespace {

using U32 = std::u32string;
using Bytes = std::string;
constexpr char32_t kReplacement = 0xFFFD;
constexpr char32_t kNone = 0xFFFFFFFF;  // "no character" (past the end)

// ---------------------------------------------------------------- UTF-8

// Length of the well-formed UTF-8 sequence starting at s[i], or, if it is
// ill-formed, minus the length of its maximal ill-formed subpart.
int utf8_sequence(const unsigned char* s, size_t n, size_t i, char32_t& cp) {
    unsigned char b = s[i];
    if (b < 0x80) {
        cp = b;
        return 1;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the 2nd byte
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
        cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        cp = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        cp = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k < len; ++k) {
        if (i + k >= n) return -k;
        unsigned char c = s[i + k];
        if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return -k;
        cp = (cp << 6) | (c & 0x3F);
    }
    return len;
}

// Strict decoding (Python's "utf-8" codec); false on any error.
bool decode_utf8_strict(const Bytes& b, U32& out) {
    out.clear();
    auto s = reinterpret_cast<const unsigned char*>(b.data());
    for (size_t i = 0; i < b.size();) {
        char32_t cp;
        int len = utf8_sequence(s, b.size(), i, cp);
        if (len < 0) return false;
        out.push_back(cp);
        i += len;
    }
    return true;
}

// ftfy's "utf-8-variants": UTF-8 plus CESU-8 surrogate pairs and Java's C0 80.
bool decode_utf8_variants(const Bytes& b, U32& out) {
    out.clear();
    auto s = reinterpret_cast<const unsigned char*>(b.data());
    size_t n = b.size();
    auto cont = [&](size_t k, unsigned lo, unsigned hi) { return k < n && s[k] >= lo && s[k] <= hi; };
    for (size_t i = 0; i < n;) {
        if (s[i] == 0xC0 && cont(i + 1, 0x80, 0x80)) {
            out.push_back(0);
            i += 2;
            continue;
        }
        if (s[i] == 0xED && cont(i + 1, 0xA0, 0xAF) && cont(i + 2, 0x80, 0xBF) && i + 3 < n && s[i + 3] == 0xED &&
            cont(i + 4, 0xB0, 0xBF) && cont(i + 5, 0x80, 0xBF)) {
            char32_t hi = 0xD000 | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
            char32_t lo = 0xD000 | ((s[i + 4] & 0x3F) << 6) | (s[i + 5] & 0x3F);
            out.push_back(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
            i += 6;
            continue;
        }
        char32_t cp;
        int len = utf8_sequence(s, n, i, cp);
        if (len < 0) return false;
        out.push_back(cp);
        i += len;
    }
    return true;
}

// ------------------------------------------------- Python character classes

bool is_ascii_letter(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_ascii_lower(char32_t c) { return c >= 'a' && c <= 'z'; }

// Python's str.isalnum() or '_': what `\w` matches in Python's re.
bool is_py_word(char32_t c) {
    if (c == '_') return true;
    if (c >= 0x110000) return false;
    int8_t t = u_charType(static_cast<UChar32>(c));
    if (t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER || t == U_MODIFIER_LETTER ||
        t == U_OTHER_LETTER)
        return true;
    return u_getIntPropertyValue(static_cast<UChar32>(c), UCHAR_NUMERIC_TYPE) != U_NT_NONE;
}

bool is_decimal_digit(char32_t c) {  // `\d` in Python's re
    return c < 0x110000 && u_charType(static_cast<UChar32>(c)) == U_DECIMAL_DIGIT_NUMBER;
}

// ------------------------------------------------------- ICU conversions

icu::UnicodeString to_icu(const U32& t) {
    return icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(t.data()), static_cast<int32_t>(t.size()));
}

U32 from_icu(const icu::UnicodeString& s) {
    U32 out;
    out.reserve(s.length());
    for (int32_t i = 0; i < s.length();) {
        UChar32 c = s.char32At(i);
        out.push_back(static_cast<char32_t>(c));
        i += U16_LENGTH(c);
    }
    return out;
}

U32 normalize(const U32& t, bool nfkc) {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* norm =
        nfkc ? icu::Normalizer2::getNFKCInstance(err) : icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err)) return t;
    icu::UnicodeString src = to_icu(t);
    if (norm->isNormalized(src, err) && U_SUCCESS(err)) return t;
    err = U_ZERO_ERROR;
    icu::UnicodeString dst = norm->normalize(src, err);
    return U_FAILURE(err) ? t : from_icu(dst);
}

// ------------------------------------------------ single-byte charmaps

// One of the single-byte encodings ftfy tries, in ftfy's order. "sloppy"
// Windows code pages decode their unassigned bytes as the Latin-1 character
// with that number and byte 1A as U+FFFD (ftfy's sloppy codecs).
struct Charmap {
    std::string name;
    bool sloppy = false;
    char32_t to_u[256];
    bool assigned[256];  // false for the holes of the strict code page
    std::unordered_map<char32_t, unsigned char> from_u;

    bool encode(const U32& text, Bytes& out) const {
        out.clear();
        for (char32_t c : text) {
            auto it = from_u.find(c);
            if (it == from_u.end()) return false;
            out.push_back(static_cast<char>(it->second));
        }
        return true;
    }
};

// The holes of the strict Windows code pages (Python's codecs leave these
// bytes undefined; ICU maps most of them to C1 controls).
bool is_hole(const std::string& cp, int b) {
    static const std::unordered_map<std::string, std::vector<int>> holes = {
        {"windows-1252", {0x81, 0x8D, 0x8F, 0x90, 0x9D}},
        {"windows-1251", {0x98}},
        {"windows-1250", {0x81, 0x83, 0x88, 0x90, 0x98}},
        {"windows-1253",
         {0x81, 0x88, 0x8A, 0x8C, 0x8D, 0x8E, 0x8F, 0x90, 0x98, 0x9A, 0x9C, 0x9D, 0x9E, 0x9F, 0xAA, 0xD2, 0xFF}},
        {"windows-1254", {0x81, 0x8D, 0x8E, 0x8F, 0x90, 0x9D, 0x9E}},
        {"windows-1257", {0x81, 0x83, 0x88, 0x8A, 0x8C, 0x90, 0x98, 0x9A, 0x9C, 0x9F, 0xA1, 0xA5}},
    };
    auto it = holes.find(cp);
    return it != holes.end() && std::find(it->second.begin(), it->second.end(), b) != it->second.end();
}

Charmap make_charmap(const std::string& name, const char* icu_name, bool sloppy) {
    Charmap m;
    m.name = name;
    m.sloppy = sloppy;
    UErrorCode err = U_ZERO_ERROR;
    UConverter* conv = icu_name ? ucnv_open(icu_name, &err) : nullptr;
    for (int b = 0; b < 256; ++b) {
        char32_t cp = static_cast<char32_t>(b);  // Latin-1, and the fallback for holes
        bool ok = !icu_name;
        if (conv && b >= 0x80) {
            char in = static_cast<char>(b);
            UChar out[4];
            UErrorCode e = U_ZERO_ERROR;
            ucnv_reset(conv);
            ucnv_setToUCallBack(conv, UCNV_TO_U_CALLBACK_STOP, nullptr, nullptr, nullptr, &e);
            int32_t n = ucnv_toUChars(conv, out, 4, &in, 1, &e);
            if (U_SUCCESS(e) && n == 1 && !is_hole(name, b)) {
                cp = out[0];
                ok = true;
            }
        } else if (b < 0x80) {
            ok = true;
        }
        m.to_u[b] = cp;
        m.assigned[b] = ok;
    }
    if (conv) ucnv_close(conv);
    if (name == "cp437") m.to_u[0xE6] = 0xB5;  // Python's cp437 has MICRO SIGN here, ICU Greek mu
    if (sloppy) m.to_u[0x1A] = kReplacement;
    for (int b = 255; b >= 0; --b) m.from_u[m.to_u[b]] = static_cast<unsigned char>(b);
    return m;
}

// ftfy's CHARMAP_ENCODINGS, in the order it tries them.
const std::vector<Charmap>& charmaps() {
    static const std::vector<Charmap> maps = [] {
        std::vector<Charmap> v;
        v.push_back(make_charmap("latin-1", nullptr, false));
        for (const char* cp :
             {"windows-1252", "windows-1251", "windows-1250", "windows-1253", "windows-1254", "windows-1257"})
            v.push_back(make_charmap(cp, cp, true));
        v.push_back(make_charmap("iso-8859-2", "iso-8859-2", false));
        v.push_back(make_charmap("macroman", "macintosh", false));
        v.push_back(make_charmap("cp437", "ibm-437", false));
        return v;
    }();
    return maps;
}

const Charmap& charmap(const char* name) {
    for (const Charmap& m : charmaps())
        if (m.name == name) return m;
    return charmaps().front();
}

// Clues for UTF-8 mojibake embedded in other text (ftfy's UTF8_CLUES): the
// characters that bytes C2-DF / E0-EF / F0,F3 / 80-BF decode to in Latin-1
// and the strict Windows code pages 1250-1254 and 1257.
struct Utf8Clues {
    std::unordered_set<char32_t> first2, first3, first4, cont, cont_strict;
};

const Utf8Clues& utf8_clues() {
    static const Utf8Clues clues = [] {
        Utf8Clues c;
        for (const Charmap& m : charmaps()) {
            if (m.name == "iso-8859-2" || m.name == "macroman" || m.name == "cp437") continue;
            for (int b = 0x80; b < 0x100; ++b) {
                if (!m.assigned[b]) continue;
                char32_t u = m.to_u[b];
                if (b >= 0xC2 && b <= 0xDF)
                    c.first2.insert(u);
                else if (b >= 0xE0 && b <= 0xEF)
                    c.first3.insert(u);
                else if (b == 0xF0 || b == 0xF3)
                    c.first4.insert(u);
                else if (b <= 0xBF)
                    c.cont.insert(u);
            }
        }
        c.cont_strict = c.cont;
        // Dashes, quotes, bullet and ellipsis often stand for themselves next to mojibake.
        for (char32_t u : {0x2013, 0x2014, 0x2015, 0x2018, 0x2019, 0x201A, 0x201C, 0x201D, 0x201E, 0x2022, 0x2026})
            c.cont_strict.erase(u);
        c.cont.insert(U' ');  // a space may have replaced byte A0
        return c;
    }();
    return clues;
}

// ------------------------------------------------- mojibake heuristic

// Character categories of ftfy's badness heuristic (badness.py); each is a
// set of the characters that show up in UTF-8 mojibake.
enum : uint32_t {
    COMMON = 1u << 0,
    C1 = 1u << 1,
    BAD = 1u << 2,
    LAW = 1u << 3,
    CUR = 1u << 4,
    SP = 1u << 5,  // start punctuation
    EP = 1u << 6,  // end punctuation
    NUM = 1u << 7,
    KAO = 1u << 8,
    UA = 1u << 9,   // upper-case accented
    LA = 1u << 10,  // lower-case accented
    UC = 1u << 11,
    LC = 1u << 12,  // upper/lower-case "common" (Greek, Cyrillic, thorn)
    BOX = 1u << 13,
};

struct Ranges {
    uint32_t cat;
    std::vector<std::pair<char32_t, char32_t>> r;
};

uint32_t category(char32_t c) {
    static const std::unordered_map<char32_t, uint32_t> table = [] {
        const std::vector<Ranges> defs = {
            {COMMON,
             {{0xA0, 0xA0},
              {0xAD, 0xAD},
              {0xB4, 0xB4},
              {0xB7, 0xB7},
              {0x2013, 0x2015},
              {0x2019, 0x2019},
              {0x2026, 0x2026}}},
            {C1, {{0x80, 0x9F}}},
            {BAD,
             {{0xA4, 0xA4},
              {0xA6, 0xA6},
              {0xA8, 0xA8},
              {0xAA, 0xAA},
              {0xAC, 0xAC},
              {0xAF, 0xAF},
              {0xB8, 0xB8},
              {0xBA, 0xBA},
              {0x192, 0x192},
              {0x2C6, 0x2C7},
              {0x2D8, 0x2D8},
              {0x2DB, 0x2DC},
              {0x2020, 0x2021},
              {0x2030, 0x2030},
              {0x2310, 0x2310},
              {0x25CA, 0x25CA},
              {0xFFFD, 0xFFFD}}},
            {LAW, {{0xA7, 0xA7}, {0xB6, 0xB6}}},
            {CUR, {{0xA2, 0xA3}, {0xA5, 0xA5}, {0x20A7, 0x20A7}, {0x20AC, 0x20AC}}},
            {SP,
             {{0xA1, 0xA1},
              {0xA9, 0xA9},
              {0xAB, 0xAB},
              {0xBF, 0xBF},
              {0x384, 0x385},
              {0x2018, 0x2018},
              {0x201A, 0x201A},
              {0x201C, 0x201C},
              {0x201E, 0x201E},
              {0x2022, 0x2022},
              {0x2039, 0x2039},
              {0xF8FF, 0xF8FF}}},
            {EP, {{0xAE, 0xAE}, {0xBB, 0xBB}, {0x2DD, 0x2DD}, {0x201D, 0x201D}, {0x203A, 0x203A}, {0x2122, 0x2122}}},
            {NUM,
             {{0xB1, 0xB3},
              {0xB5, 0xB5},
              {0xB9, 0xB9},
              {0xBC, 0xBE},
              {0xD7, 0xD7},
              {0xF7, 0xF7},
              {0x2044, 0x2044},
              {0x2116, 0x2116},
              {0x2202, 0x2202},
              {0x2206, 0x2206},
              {0x220F, 0x220F},
              {0x2211, 0x2211},
              {0x221A, 0x221A},
              {0x221E, 0x221E},
              {0x2229, 0x2229},
              {0x222B, 0x222B},
              {0x2248, 0x2248},
              {0x2260, 0x2261},
              {0x2264, 0x2265}}},
            {KAO,
             {{0xB0, 0xB0},
              {0xD2, 0xD6},
              {0xD9, 0xDC},
              {0xF2, 0xF6},
              {0xF8, 0xFC},
              {0x14C, 0x14C},
              {0x150, 0x150},
              {0x16A, 0x16A},
              {0x172, 0x172}}},
            {UA, {{0xC0, 0xD1},   {0xD8, 0xD8},   {0xDC, 0xDD},   {0x100, 0x100}, {0x102, 0x102}, {0x104, 0x104},
                  {0x106, 0x106}, {0x10C, 0x10C}, {0x10E, 0x10E}, {0x110, 0x110}, {0x112, 0x112}, {0x116, 0x116},
                  {0x118, 0x118}, {0x11A, 0x11A}, {0x11E, 0x11E}, {0x122, 0x122}, {0x12A, 0x12A}, {0x130, 0x130},
                  {0x136, 0x136}, {0x139, 0x139}, {0x13B, 0x13B}, {0x13D, 0x13D}, {0x141, 0x141}, {0x143, 0x143},
                  {0x145, 0x145}, {0x147, 0x147}, {0x152, 0x152}, {0x158, 0x158}, {0x15A, 0x15A}, {0x15E, 0x15E},
                  {0x160, 0x160}, {0x162, 0x162}, {0x164, 0x164}, {0x16E, 0x16E}, {0x170, 0x170}, {0x178, 0x179},
                  {0x17B, 0x17B}, {0x17D, 0x17D}, {0x490, 0x490}}},
            {LA, {{0xDF, 0xF1},   {0xFC, 0xFC},   {0x101, 0x101},  {0x103, 0x103}, {0x105, 0x105}, {0x107, 0x107},
                  {0x10D, 0x10D}, {0x10F, 0x10F}, {0x111, 0x111},  {0x113, 0x113}, {0x117, 0x117}, {0x119, 0x119},
                  {0x11B, 0x11B}, {0x11F, 0x11F}, {0x123, 0x123},  {0x12B, 0x12B}, {0x12F, 0x12F}, {0x137, 0x137},
                  {0x13A, 0x13A}, {0x13C, 0x13C}, {0x13E, 0x13E},  {0x142, 0x142}, {0x153, 0x153}, {0x155, 0x155},
                  {0x15B, 0x15B}, {0x15F, 0x15F}, {0x161, 0x161},  {0x165, 0x165}, {0x17A, 0x17A}, {0x17C, 0x17C},
                  {0x17E, 0x17E}, {0x491, 0x491}, {0xFB01, 0xFB02}}},
            {UC,
             {{0xDE, 0xDE},
              {0x386, 0x386},
              {0x388, 0x38A},
              {0x38C, 0x38C},
              {0x38E, 0x38F},
              {0x391, 0x3AB},
              {0x401, 0x42F}}},
            {LC, {{0x3AC, 0x3C9}, {0x430, 0x45F}}},
            {BOX,
             {{0x2502, 0x2502},
              {0x250C, 0x250C},
              {0x2510, 0x2510},
              {0x2518, 0x2518},
              {0x251C, 0x251C},
              {0x2524, 0x2524},
              {0x252C, 0x252C},
              {0x253C, 0x253C},
              {0x2550, 0x256C},
              {0x2580, 0x2580},
              {0x2584, 0x2584},
              {0x2588, 0x2588},
              {0x258C, 0x258C},
              {0x2590, 0x2593}}},
        };
        std::unordered_map<char32_t, uint32_t> t;
        for (const Ranges& d : defs)
            for (auto [lo, hi] : d.r)
                for (char32_t c = lo; c <= hi; ++c) t[c] |= d.cat;
        return t;
    }();
    auto it = table.find(c);
    return it == table.end() ? 0 : it->second;
}

bool one_of(char32_t c, std::u32string_view set) { return c != kNone && set.find(c) != set.npos; }

// ftfy's BADNESS_RE: true if any of its patterns matches somewhere in t.
// Each numbered line is one alternative of that expression, tried at every
// position i.
bool is_bad_impl(const U32& t) {
    const size_t n = t.size();
    auto at = [&](size_t k) { return k < n ? t[k] : kNone; };
    auto cat = [&](size_t k) { return k < n ? category(t[k]) : 0u; };
    const uint32_t ACCENTED_ETC = LA | UA | BOX | SP | EP | CUR | NUM | LAW;
    for (size_t i = 0; i < n; ++i) {
        const char32_t c = t[i];
        const uint32_t k0 = category(c), k1 = cat(i + 1), k2 = cat(i + 2);
        const char32_t c1 = at(i + 1), c2 = at(i + 2);
        if (k0 & C1) return true;
        if ((k0 & (BAD | ACCENTED_ETC)) && (k1 & BAD)) return true;
        if (is_ascii_letter(c) && (k1 & (LC | UC)) && (k2 & BAD)) return true;
        if ((k0 & BAD) && (k1 & ACCENTED_ETC)) return true;
        if ((k0 & (LA | LC | BOX | EP | CUR | NUM)) && (k1 & UA)) return true;
        if ((k0 & (BOX | EP | CUR | NUM)) && (k1 & LA)) return true;
        if ((k0 & (LA | BOX | EP)) && (k1 & CUR)) return true;
        if (is_py_space(c) && (k1 & UA) && (k2 & CUR)) return true;
        if ((k0 & (UA | BOX)) && (k1 & (NUM | LAW))) return true;
        if ((k0 & (LA | UA | BOX | CUR | EP)) && (k1 & SP) && (k2 & NUM)) return true;
        if ((k0 & (LA | UA | CUR | NUM | BOX | LAW)) && (k1 & EP) && (k2 & SP)) return true;
        if ((k0 & (CUR | NUM | BOX)) && (k1 & SP)) return true;
        if (is_ascii_lower(c) && (k1 & UA) && (k2 & (SP | CUR))) return true;
        if ((k0 & BOX) && (k1 & KAO)) return true;
        if ((k0 & (LA | UA | CUR | NUM | SP | EP | LAW)) && (k1 & BOX)) return true;
        if ((k0 & BOX) && (k1 & EP)) return true;
        if ((k0 & (LA | UA)) && (k1 & (SP | EP)) && c2 != kNone && is_py_word(c2)) return true;
        if ((c == 0x152 || c == 0x153) && c1 != kNone && !is_ascii_letter(c1)) return true;  // Œœ
        if ((k0 & UA) && c1 == 0xB0) return true;
        // Windows-1252 two-character mojibake not covered above.
        if (one_of(c, U"\u00c2\u00c3\u00ce\u00d0") &&
            (one_of(c1,
                    U"\u20ac\u0153\u0160\u0161\u00a2\u00a3\u0178\u017e\u00a0\u00ad\u00ae\u00a9"
                    U"\u00b0\u00b7\u00bb\u2013\u2014\u00b4") ||
             (k1 & (SP | EP))))
            return true;
        if (c == 0xD7 && one_of(c1, U"\u00b2\u00b3")) return true;
        // Arabic in Windows-1252: four characters.
        auto arabic_2nd = [&](size_t k) {
            return (cat(k) & (COMMON | CUR | BAD | NUM | SP)) || one_of(at(k), U"\u0178\u0160\u00ae\u00b0\u00b5\u00bb");
        };
        if (one_of(c, U"\u00d8\u00d9") && arabic_2nd(i + 1) && one_of(c2, U"\u00d8\u00d9") && arabic_2nd(i + 3))
            return true;
        if (c == 0xE0 && one_of(c1, U"\u00b2\u00b5\u00b9\u00bc\u00bd\u00be")) return true;
        // MacRoman.
        if (c == 0x221A && one_of(c1, U"\u00b1\u2202\u2020\u2260\u00ae\u2122\u00b4\u2264\u2265\u00a5\u00b5\u00f8"))
            return true;
        if (c == 0x2248 && one_of(c1, U"\u00b0\u00a2")) return true;
        if (c == 0x201A && c1 == 0xC4 &&
            one_of(c2, U"\u00ec\u00ee\u00ef\u00f2\u00f4\u00fa\u00f9\u00fb\u2020\u00b0\u00a2\u03c0"))
            return true;
        if (c == 0x201A && one_of(c1, U"\u00e2\u00f3") && one_of(c2, U"\u00e0\u00e4\u00b0\u00ea")) return true;
        // Windows-1251.
        if (c == 0x432 && c1 == 0x402) return true;
        const std::u32string_view vgrs = U"\u0412\u0413\u0420\u0421";
        if (one_of(c, vgrs) && ((k1 & (C1 | BAD | SP | EP | CUR)) || one_of(c1, U"\u00b0\u00b5")) && one_of(c2, vgrs))
            return true;
        if (t.compare(i, 5, U"\u0413\u045e\u0412\u0402\u0412") == 0 && at(i + 5) != kNone && at(i + 5) != '\n' &&
            (is_ascii_letter(at(i + 6)) || at(i + 6) == ' '))
            return true;
        // Windows-1252 'à', 'á' and no-break space.
        if (c == 0xC3 && (c1 == 0xA0 || c1 == 0xA1)) return true;
        if (is_ascii_lower(c) && ((one_of(c1, U"\u00c3\u00c2") && c2 == ' ') ||
                                  (c1 != kNone && is_py_space(c1) && one_of(c2, U"\u00c3\u00c2") && at(i + 3) == ' ')))
            return true;
        if (i == 0 && one_of(c, U"\u00c3\u00c2") && c1 == ' ') return true;
        if ((is_ascii_lower(c) || one_of(c, U".,?!") || (k0 & EP)) && c1 == 0xC2 && (c2 == ' ' || (k2 & (SP | EP))))
            return true;
        // Windows-1253.
        if (c == 0x3B2 && c1 == 0x20AC && one_of(c2, U"\u2122\u00a0\u0386\u00ad\u00ae\u00b0")) return true;
        const std::u32string_view greek = U"\u0392\u0393\u039e\u039f";
        if (one_of(c, greek) && ((k1 & (C1 | BAD | SP | EP | CUR)) || c1 == 0xB0) && one_of(c2, greek)) return true;
        // Windows-1257.
        if (c == 0x101 && c1 == 0x20AC) return true;
    }
    return false;
}

// ------------------------------------------------------- fix_encoding

// Byte-level helpers of ftfy's encoding fixer.
bool in_range(const Bytes& b, size_t k, unsigned lo, unsigned hi) {
    return k < b.size() && static_cast<unsigned char>(b[k]) >= lo && static_cast<unsigned char>(b[k]) <= hi;
}
bool byte_is(const Bytes& b, size_t k, unsigned v) { return in_range(b, k, v, v); }

// ALTERED_UTF8_RE: a UTF-8 sequence whose A0 byte was turned into a space.
size_t altered_utf8_at(const Bytes& b, size_t i) {
    auto x = [&](size_t k) {  // a continuation byte other than 85 and A0
        return in_range(b, k, 0x80, 0x84) || in_range(b, k, 0x86, 0x9F) || in_range(b, k, 0xA1, 0xBF);
    };
    auto cont = [&](size_t k) { return in_range(b, k, 0x80, 0xBF); };
    auto sp = [&](size_t k) { return byte_is(b, k, ' '); };
    unsigned char c = static_cast<unsigned char>(b[i]);
    if ((c == 0xC2 || c == 0xC3 || c == 0xC5 || c == 0xCE || c == 0xD0 || c == 0xD9) && sp(i + 1)) return 2;
    if ((c == 0xE2 || c == 0xE3) && sp(i + 1) && x(i + 2)) return 3;
    if (c >= 0xE0 && c <= 0xE3 && x(i + 1) && sp(i + 2)) return 3;
    if (c == 0xF0 && ((sp(i + 1) && cont(i + 2) && cont(i + 3)) || (cont(i + 1) && sp(i + 2) && cont(i + 3)) ||
                      (cont(i + 1) && cont(i + 2) && sp(i + 3))))
        return 4;
    return 0;
}

bool has_altered_utf8(const Bytes& b) {
    for (size_t i = 0; i < b.size(); ++i)
        if (altered_utf8_at(b, i)) return true;
    return false;
}

// ftfy's restore_byte_a0: put back A0 bytes that became spaces.
Bytes restore_byte_a0(const Bytes& in) {
    // "Ã " (C3 20) is almost always "à" followed by a space, so keep the space
    // (except before Portuguese "às", "àquele"... and double spaces).
    Bytes b;
    for (size_t i = 0; i < in.size(); ++i) {
        if (byte_is(in, i, 0xC3) && byte_is(in, i + 1, ' ')) {
            std::string_view rest(in.data() + i + 2, in.size() - i - 2);
            bool exception = rest.substr(0, 1) == " " || rest.substr(0, 5) == "quele" || rest.substr(0, 5) == "quela" ||
                             rest.substr(0, 5) == "quilo" || rest.substr(0, 2) == "s ";
            if (!exception) {
                b += "\xC3\xA0 ";
                ++i;
                continue;
            }
        }
        b.push_back(in[i]);
    }
    Bytes out;
    for (size_t i = 0; i < b.size();) {
        size_t len = altered_utf8_at(b, i);
        if (!len) {
            out.push_back(b[i++]);
            continue;
        }
        for (size_t k = i; k < i + len; ++k) out.push_back(b[k] == ' ' ? '\xA0' : b[k]);
        i += len;
    }
    return out;
}

// ftfy's replace_lossy_sequences: UTF-8 sequences with bytes lost to U+FFFD
// (byte 1A in the sloppy codecs) or '?' decode as U+FFFD.
Bytes replace_lossy_sequences(const Bytes& b) {
    auto r = [&](size_t k, unsigned lo, unsigned hi) { return in_range(b, k, lo, hi); };
    auto lost = [&](size_t k) { return byte_is(b, k, 0x1A) || byte_is(b, k, '?'); };
    auto lost_or_cont = [&](size_t k) { return lost(k) || r(k, 0x80, 0xBF); };
    auto sub_or_cont = [&](size_t k) { return byte_is(b, k, 0x1A) || r(k, 0x80, 0xBF); };
    auto match = [&](size_t i) -> size_t {
        if (r(i, 0xC2, 0xDF) && byte_is(b, i + 1, 0x1A)) return 2;
        if (r(i, 0xC2, 0xC3) && byte_is(b, i + 1, '?')) return 2;
        if (byte_is(b, i, 0xED) && r(i + 1, 0xA0, 0xAF) && byte_is(b, i + 3, 0xED) && r(i + 4, 0xB0, 0xBF) &&
            ((lost(i + 2) && lost_or_cont(i + 5)) || (lost_or_cont(i + 2) && lost(i + 5))))
            return 6;
        if (r(i, 0xE0, 0xEF) && ((lost(i + 1) && sub_or_cont(i + 2)) || (sub_or_cont(i + 1) && lost(i + 2)))) return 3;
        if (r(i, 0xF0, 0xF4) && ((lost(i + 1) && sub_or_cont(i + 2) && sub_or_cont(i + 3)) ||
                                 (sub_or_cont(i + 1) && lost(i + 2) && sub_or_cont(i + 3)) ||
                                 (sub_or_cont(i + 1) && sub_or_cont(i + 2) && lost(i + 3))))
            return 4;
        if (byte_is(b, i, 0x1A)) return 1;
        return 0;
    };
    Bytes out;
    for (size_t i = 0; i < b.size();) {
        size_t len = match(i);
        if (len) {
            out += "\xEF\xBF\xBD";
            i += len;
        } else {
            out.push_back(b[i++]);
        }
    }
    return out;
}

bool is_ascii(const U32& t) {
    return std::all_of(t.begin(), t.end(), [](char32_t c) { return c < 0x80; });
}

U32 fix_encoding_impl(const U32& text);

// A C1 control read as its (sloppy) Windows-1252 character.
char32_t fix_c1_char(char32_t c) { return charmap("windows-1252").to_u[c]; }

// ftfy's fix_c1_controls.
U32 fix_c1_controls(U32 t) {
    for (char32_t& c : t)
        if (c >= 0x80 && c <= 0x9F) c = fix_c1_char(c);
    return t;
}

// Length of a UTF8_DETECTOR_RE match at i (0 if none): one or more
// sequences that look like UTF-8 decoded with a single-byte code page.
size_t utf8_detector_at(const U32& t, size_t i) {
    const Utf8Clues& k = utf8_clues();
    auto in = [&](size_t p, const std::unordered_set<char32_t>& set) { return p < t.size() && set.count(t[p]); };
    if (i > 0 && k.cont_strict.count(t[i - 1])) return 0;
    size_t j = i;
    for (;;) {
        if (in(j, k.first2) && in(j + 1, k.cont))
            j += 2;
        else if (in(j, k.first3) && in(j + 1, k.cont) && in(j + 2, k.cont))
            j += 3;
        else if (in(j, k.first4) && in(j + 1, k.cont) && in(j + 2, k.cont) && in(j + 3, k.cont))
            j += 4;
        else
            break;
    }
    return j - i;
}

// ftfy's decode_inconsistent_utf8: fix mojibake embedded in other text.
U32 decode_inconsistent_utf8(const U32& t) {
    U32 out;
    for (size_t i = 0; i < t.size();) {
        size_t len = utf8_detector_at(t, i);
        if (!len) {
            out.push_back(t[i++]);
            continue;
        }
        U32 sub = t.substr(i, len);
        out += (len < t.size() && is_bad_impl(sub)) ? fix_encoding_impl(sub) : sub;
        i += len;
    }
    return out;
}

// One step of ftfy's fix_encoding: the first re-decoding that works.
U32 fix_encoding_step(const U32& text) {
    if (text.empty() || is_ascii(text) || !is_bad_impl(text)) return text;
    bool latin1_possible = false;
    Bytes bytes;
    for (const Charmap& m : charmaps()) {
        if (!m.encode(text, bytes)) continue;
        if (m.name == "latin-1") latin1_possible = true;
        if (m.name != "macroman" && has_altered_utf8(bytes)) bytes = restore_byte_a0(bytes);
        if (m.sloppy) bytes = replace_lossy_sequences(bytes);
        bool variants = bytes.find('\xED') != Bytes::npos || bytes.find('\xC0') != Bytes::npos;
        U32 fixed;
        if (variants ? decode_utf8_variants(bytes, fixed) : decode_utf8_strict(bytes, fixed)) return fixed;
    }
    for (size_t i = 0; i < text.size(); ++i) {
        if (utf8_detector_at(text, i)) {
            U32 fixed = decode_inconsistent_utf8(text);
            if (fixed != text) return fixed;
            break;
        }
    }
    // Latin-1 text with C1 controls was probably meant as Windows-1252. (ftfy
    // also tests for "windows-1252" in its list of sloppy names, which never
    // matches, so this runs for any Latin-1 text.)
    if (latin1_possible) {
        const Charmap& w1252 = charmap("windows-1252");
        U32 fixed = text;
        bool ok = true;
        for (char32_t& c : fixed) {
            if (c >= 0x80 && c <= 0x9F) {
                if (!w1252.assigned[c]) {
                    ok = false;
                    break;
                }
                c = w1252.to_u[c];
            }
        }
        if (ok && fixed != text) return fixed;
    }
    if (std::any_of(text.begin(), text.end(), [](char32_t c) { return c >= 0x80 && c <= 0x9F; }))
        return fix_c1_controls(text);
    return text;
}

U32 fix_encoding_impl(const U32& text) {
    U32 cur = text;
    for (int iter = 0; iter < 100; ++iter) {  // ftfy loops until nothing changes
        U32 next = fix_encoding_step(cur);
        if (next == cur) break;
        cur = std::move(next);
    }
    return cur;
}

// ------------------------------------------------------- other fixers

struct Entity {
    const char* name;
    char32_t cp;
};

// HTML 4 named entities plus &apos;, with the values of Python's html5 table
// (which also has case variants such as &AMP; and &Cap;), and the all-caps
// forms ftfy adds (&EACUTE; -> 'É'; &SZLIG; -> "SS" is handled in code).
const Entity kEntities[] = {
    {"AACUTE", 0xC1},    {"ACIRC", 0xC2},     {"ACUTE", 0xB4},    {"AELIG", 0xC6},    {"AElig", 0xC6},
    {"AGRAVE", 0xC0},    {"ALEFSYM", 0x2135}, {"ALPHA", 0x391},   {"AMP", 0x26},      {"AND", 0x2227},
    {"ANG", 0x2220},     {"APOS", 0x27},      {"ARING", 0xC5},    {"ASYMP", 0x2248},  {"ATILDE", 0xC3},
    {"AUML", 0xC4},      {"Aacute", 0xC1},    {"Acirc", 0xC2},    {"Agrave", 0xC0},   {"Alpha", 0x391},
    {"And", 0x2A53},     {"Aring", 0xC5},     {"Atilde", 0xC3},   {"Auml", 0xC4},     {"BDQUO", 0x201E},
    {"BETA", 0x392},     {"BRVBAR", 0xA6},    {"BULL", 0x2022},   {"Beta", 0x392},    {"CAP", 0x2229},
    {"CCEDIL", 0xC7},    {"CEDIL", 0xB8},     {"CENT", 0xA2},     {"CHI", 0x3A7},     {"CIRC", 0x2C6},
    {"CLUBS", 0x2663},   {"CONG", 0x2245},    {"COPY", 0xA9},     {"CRARR", 0x21B5},  {"CUP", 0x222A},
    {"CURREN", 0xA4},    {"Cap", 0x22D2},     {"Ccedil", 0xC7},   {"Chi", 0x3A7},     {"Cup", 0x22D3},
    {"DAGGER", 0x2020},  {"DARR", 0x2193},    {"DEG", 0xB0},      {"DELTA", 0x394},   {"DIAMS", 0x2666},
    {"DIVIDE", 0xF7},    {"Dagger", 0x2021},  {"Darr", 0x21A1},   {"Delta", 0x394},   {"EACUTE", 0xC9},
    {"ECIRC", 0xCA},     {"EGRAVE", 0xC8},    {"EMPTY", 0x2205},  {"EMSP", 0x2003},   {"ENSP", 0x2002},
    {"EPSILON", 0x395},  {"EQUIV", 0x2261},   {"ETA", 0x397},     {"ETH", 0xD0},      {"EUML", 0xCB},
    {"EURO", 0x20AC},    {"EXIST", 0x2203},   {"Eacute", 0xC9},   {"Ecirc", 0xCA},    {"Egrave", 0xC8},
    {"Epsilon", 0x395},  {"Eta", 0x397},      {"Euml", 0xCB},     {"FNOF", 0x191},    {"FORALL", 0x2200},
    {"FRAC12", 0xBD},    {"FRAC14", 0xBC},    {"FRAC34", 0xBE},   {"FRASL", 0x2044},  {"ForAll", 0x2200},
    {"GAMMA", 0x393},    {"GE", 0x2265},      {"GT", 0x3E},       {"Gamma", 0x393},   {"Gt", 0x226B},
    {"HARR", 0x2194},    {"HEARTS", 0x2665},  {"HELLIP", 0x2026}, {"IACUTE", 0xCD},   {"ICIRC", 0xCE},
    {"IEXCL", 0xA1},     {"IGRAVE", 0xCC},    {"IMAGE", 0x2111},  {"INFIN", 0x221E},  {"INT", 0x222B},
    {"IOTA", 0x399},     {"IQUEST", 0xBF},    {"ISIN", 0x2208},   {"IUML", 0xCF},     {"Iacute", 0xCD},
    {"Icirc", 0xCE},     {"Igrave", 0xCC},    {"Int", 0x222C},    {"Iota", 0x399},    {"Iuml", 0xCF},
    {"KAPPA", 0x39A},    {"Kappa", 0x39A},    {"LAMBDA", 0x39B},  {"LANG", 0x27E8},   {"LAQUO", 0xAB},
    {"LARR", 0x2190},    {"LCEIL", 0x2308},   {"LDQUO", 0x201C},  {"LE", 0x2264},     {"LFLOOR", 0x230A},
    {"LOWAST", 0x2217},  {"LOZ", 0x25CA},     {"LRM", 0x200E},    {"LSAQUO", 0x2039}, {"LSQUO", 0x2018},
    {"LT", 0x3C},        {"Lambda", 0x39B},   {"Lang", 0x27EA},   {"Larr", 0x219E},   {"Lt", 0x226A},
    {"MACR", 0xAF},      {"MDASH", 0x2014},   {"MICRO", 0x39C},   {"MIDDOT", 0xB7},   {"MINUS", 0x2212},
    {"MU", 0x39C},       {"Mu", 0x39C},       {"NABLA", 0x2207},  {"NBSP", 0xA0},     {"NDASH", 0x2013},
    {"NE", 0x2260},      {"NI", 0x220B},      {"NOT", 0xAC},      {"NOTIN", 0x2209},  {"NSUB", 0x2284},
    {"NTILDE", 0xD1},    {"NU", 0x39D},       {"Not", 0x2AEC},    {"Ntilde", 0xD1},   {"Nu", 0x39D},
    {"OACUTE", 0xD3},    {"OCIRC", 0xD4},     {"OELIG", 0x152},   {"OElig", 0x152},   {"OGRAVE", 0xD2},
    {"OLINE", 0x203E},   {"OMEGA", 0x3A9},    {"OMICRON", 0x39F}, {"OPLUS", 0x2295},  {"OR", 0x2228},
    {"ORDF", 0xAA},      {"ORDM", 0xBA},      {"OSLASH", 0xD8},   {"OTILDE", 0xD5},   {"OTIMES", 0x2297},
    {"OUML", 0xD6},      {"Oacute", 0xD3},    {"Ocirc", 0xD4},    {"Ograve", 0xD2},   {"Omega", 0x3A9},
    {"Omicron", 0x39F},  {"Or", 0x2A54},      {"Oslash", 0xD8},   {"Otilde", 0xD5},   {"Otimes", 0x2A37},
    {"Ouml", 0xD6},      {"PARA", 0xB6},      {"PART", 0x2202},   {"PERMIL", 0x2030}, {"PERP", 0x22A5},
    {"PHI", 0x3A6},      {"PI", 0x3A0},       {"PIV", 0x3A0},     {"PLUSMN", 0xB1},   {"POUND", 0xA3},
    {"PRIME", 0x2032},   {"PROD", 0x220F},    {"PROP", 0x221D},   {"PSI", 0x3A8},     {"Phi", 0x3A6},
    {"Pi", 0x3A0},       {"Prime", 0x2033},   {"Psi", 0x3A8},     {"QUOT", 0x22},     {"RADIC", 0x221A},
    {"RANG", 0x27E9},    {"RAQUO", 0xBB},     {"RARR", 0x2192},   {"RCEIL", 0x2309},  {"RDQUO", 0x201D},
    {"REAL", 0x211C},    {"REG", 0xAE},       {"RFLOOR", 0x230B}, {"RHO", 0x3A1},     {"RLM", 0x200F},
    {"RSAQUO", 0x203A},  {"RSQUO", 0x2019},   {"Rang", 0x27EB},   {"Rarr", 0x21A0},   {"Rho", 0x3A1},
    {"SBQUO", 0x201A},   {"SCARON", 0x160},   {"SDOT", 0x22C5},   {"SECT", 0xA7},     {"SHY", 0xAD},
    {"SIGMA", 0x3A3},    {"SIGMAF", 0x3A3},   {"SIM", 0x223C},    {"SPADES", 0x2660}, {"SUB", 0x2282},
    {"SUBE", 0x2286},    {"SUM", 0x2211},     {"SUP", 0x2283},    {"SUP1", 0xB9},     {"SUP2", 0xB2},
    {"SUP3", 0xB3},      {"SUPE", 0x2287},    {"Scaron", 0x160},  {"Sigma", 0x3A3},   {"Sub", 0x22D0},
    {"Sum", 0x2211},     {"Sup", 0x22D1},     {"TAU", 0x3A4},     {"THERE4", 0x2234}, {"THETA", 0x398},
    {"THETASYM", 0x398}, {"THINSP", 0x2009},  {"THORN", 0xDE},    {"TILDE", 0x2DC},   {"TIMES", 0xD7},
    {"TRADE", 0x2122},   {"Tau", 0x3A4},      {"Theta", 0x398},   {"Tilde", 0x223C},  {"UACUTE", 0xDA},
    {"UARR", 0x2191},    {"UCIRC", 0xDB},     {"UGRAVE", 0xD9},   {"UML", 0xA8},      {"UPSIH", 0x3D2},
    {"UPSILON", 0x3A5},  {"UUML", 0xDC},      {"Uacute", 0xDA},   {"Uarr", 0x219F},   {"Ucirc", 0xDB},
    {"Ugrave", 0xD9},    {"Upsilon", 0x3A5},  {"Uuml", 0xDC},     {"WEIERP", 0x2118}, {"XI", 0x39E},
    {"Xi", 0x39E},       {"YACUTE", 0xDD},    {"YEN", 0xA5},      {"YUML", 0x178},    {"Yacute", 0xDD},
    {"Yuml", 0x178},     {"ZETA", 0x396},     {"ZWJ", 0x200D},    {"ZWNJ", 0x200C},   {"Zeta", 0x396},
    {"aacute", 0xE1},    {"acirc", 0xE2},     {"acute", 0xB4},    {"aelig", 0xE6},    {"agrave", 0xE0},
    {"alefsym", 0x2135}, {"alpha", 0x3B1},    {"amp", 0x26},      {"and", 0x2227},    {"ang", 0x2220},
    {"apos", 0x27},      {"aring", 0xE5},     {"asymp", 0x2248},  {"atilde", 0xE3},   {"auml", 0xE4},
    {"bdquo", 0x201E},   {"beta", 0x3B2},     {"brvbar", 0xA6},   {"bull", 0x2022},   {"cap", 0x2229},
    {"ccedil", 0xE7},    {"cedil", 0xB8},     {"cent", 0xA2},     {"chi", 0x3C7},     {"circ", 0x2C6},
    {"clubs", 0x2663},   {"cong", 0x2245},    {"copy", 0xA9},     {"crarr", 0x21B5},  {"cup", 0x222A},
    {"curren", 0xA4},    {"dArr", 0x21D3},    {"dagger", 0x2020}, {"darr", 0x2193},   {"deg", 0xB0},
    {"delta", 0x3B4},    {"diams", 0x2666},   {"divide", 0xF7},   {"eacute", 0xE9},   {"ecirc", 0xEA},
    {"egrave", 0xE8},    {"empty", 0x2205},   {"emsp", 0x2003},   {"ensp", 0x2002},   {"epsilon", 0x3B5},
    {"equiv", 0x2261},   {"eta", 0x3B7},      {"eth", 0xF0},      {"euml", 0xEB},     {"euro", 0x20AC},
    {"exist", 0x2203},   {"fnof", 0x192},     {"forall", 0x2200}, {"frac12", 0xBD},   {"frac14", 0xBC},
    {"frac34", 0xBE},    {"frasl", 0x2044},   {"gE", 0x2267},     {"gamma", 0x3B3},   {"ge", 0x2265},
    {"gt", 0x3E},        {"hArr", 0x21D4},    {"harr", 0x2194},   {"hearts", 0x2665}, {"hellip", 0x2026},
    {"iacute", 0xED},    {"icirc", 0xEE},     {"iexcl", 0xA1},    {"igrave", 0xEC},   {"image", 0x2111},
    {"infin", 0x221E},   {"int", 0x222B},     {"iota", 0x3B9},    {"iquest", 0xBF},   {"isin", 0x2208},
    {"iuml", 0xEF},      {"kappa", 0x3BA},    {"lArr", 0x21D0},   {"lE", 0x2266},     {"lambda", 0x3BB},
    {"lang", 0x27E8},    {"laquo", 0xAB},     {"larr", 0x2190},   {"lceil", 0x2308},  {"ldquo", 0x201C},
    {"le", 0x2264},      {"lfloor", 0x230A},  {"lowast", 0x2217}, {"loz", 0x25CA},    {"lrm", 0x200E},
    {"lsaquo", 0x2039},  {"lsquo", 0x2018},   {"lt", 0x3C},       {"macr", 0xAF},     {"mdash", 0x2014},
    {"micro", 0xB5},     {"middot", 0xB7},    {"minus", 0x2212},  {"mu", 0x3BC},      {"nabla", 0x2207},
    {"nbsp", 0xA0},      {"ndash", 0x2013},   {"ne", 0x2260},     {"ni", 0x220B},     {"not", 0xAC},
    {"notin", 0x2209},   {"nsub", 0x2284},    {"ntilde", 0xF1},   {"nu", 0x3BD},      {"oacute", 0xF3},
    {"ocirc", 0xF4},     {"oelig", 0x153},    {"ograve", 0xF2},   {"oline", 0x203E},  {"omega", 0x3C9},
    {"omicron", 0x3BF},  {"oplus", 0x2295},   {"or", 0x2228},     {"ordf", 0xAA},     {"ordm", 0xBA},
    {"oslash", 0xF8},    {"otilde", 0xF5},    {"otimes", 0x2297}, {"ouml", 0xF6},     {"para", 0xB6},
    {"part", 0x2202},    {"permil", 0x2030},  {"perp", 0x22A5},   {"phi", 0x3C6},     {"pi", 0x3C0},
    {"piv", 0x3D6},      {"plusmn", 0xB1},    {"pound", 0xA3},    {"prime", 0x2032},  {"prod", 0x220F},
    {"prop", 0x221D},    {"psi", 0x3C8},      {"quot", 0x22},     {"rArr", 0x21D2},   {"radic", 0x221A},
    {"rang", 0x27E9},    {"raquo", 0xBB},     {"rarr", 0x2192},   {"rceil", 0x2309},  {"rdquo", 0x201D},
    {"real", 0x211C},    {"reg", 0xAE},       {"rfloor", 0x230B}, {"rho", 0x3C1},     {"rlm", 0x200F},
    {"rsaquo", 0x203A},  {"rsquo", 0x2019},   {"sbquo", 0x201A},  {"scaron", 0x161},  {"sdot", 0x22C5},
    {"sect", 0xA7},      {"shy", 0xAD},       {"sigma", 0x3C3},   {"sigmaf", 0x3C2},  {"sim", 0x223C},
    {"spades", 0x2660},  {"sub", 0x2282},     {"subE", 0x2AC5},   {"sube", 0x2286},   {"sum", 0x2211},
    {"sup", 0x2283},     {"sup1", 0xB9},      {"sup2", 0xB2},     {"sup3", 0xB3},     {"supE", 0x2AC6},
    {"supe", 0x2287},    {"szlig", 0xDF},     {"tau", 0x3C4},     {"there4", 0x2234}, {"theta", 0x3B8},
    {"thetasym", 0x3D1}, {"thinsp", 0x2009},  {"thorn", 0xFE},    {"tilde", 0x2DC},   {"times", 0xD7},
    {"trade", 0x2122},   {"uArr", 0x21D1},    {"uacute", 0xFA},   {"uarr", 0x2191},   {"ucirc", 0xFB},
    {"ugrave", 0xF9},    {"uml", 0xA8},       {"upsih", 0x3D2},   {"upsilon", 0x3C5}, {"uuml", 0xFC},
    {"weierp", 0x2118},  {"xi", 0x3BE},       {"yacute", 0xFD},   {"yen", 0xA5},      {"yuml", 0xFF},
    {"zeta", 0x3B6},     {"zwj", 0x200D},     {"zwnj", 0x200C},
};

// Python's html.unescape for a numeric character reference.
U32 html_charref(char32_t num) {
    if (num == 0) return U32(1, kReplacement);
    if (num == 0x0D) return U"\r";
    if (num >= 0x80 && num <= 0x9F) return U32(1, fix_c1_char(num));  // as Windows-1252
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return U32(1, kReplacement);
    bool invalid = (num >= 0x01 && num <= 0x08) || num == 0x0B || (num >= 0x0E && num <= 0x1F) || num == 0x7F ||
                   (num >= 0xFDD0 && num <= 0xFDEF) || (num & 0xFFFE) == 0xFFFE;
    return invalid ? U32() : U32(1, num);
}

// ftfy's unescape_html: entities that end in ';' (HTML_ENTITY_RE is
// &#?[0-9A-Za-z]{1,24};), numeric ones as Python's html.unescape.
U32 unescape_html(const U32& t) {
    static const std::unordered_map<std::string, char32_t> names = [] {
        std::unordered_map<std::string, char32_t> m;
        for (const Entity& e : kEntities) m.emplace(e.name, e.cp);
        return m;
    }();
    auto alnum = [](char32_t c) { return (c >= '0' && c <= '9') || is_ascii_letter(c); };
    U32 out;
    for (size_t i = 0; i < t.size();) {
        if (t[i] != '&') {
            out.push_back(t[i++]);
            continue;
        }
        size_t j = i + 1;
        bool numeric = j < t.size() && t[j] == '#';
        if (numeric) ++j;
        size_t start = j;
        while (j < t.size() && alnum(t[j]) && j - start < 24) ++j;
        if (j == start || j >= t.size() || t[j] != ';') {
            out.push_back(t[i++]);
            continue;
        }
        std::string body(t.begin() + start, t.begin() + j);  // ASCII only
        size_t end = j + 1;
        if (!numeric) {
            auto it = names.find(body);
            if (body == "SZLIG")
                out += U"SS";  // 'ß'.upper()
            else if (it == names.end())
                out.append(t, i, end - i);
            else
                out.push_back(it->second);
            i = end;
            continue;
        }
        // &#123; or &#x1F431; must be all digits, else html.unescape leaves the ';'.
        bool hex = body[0] == 'x' || body[0] == 'X';
        std::string digits = hex ? body.substr(1) : body;
        auto is_digit = [&](char ch) {
            auto u = static_cast<unsigned char>(ch);
            return hex ? std::isxdigit(u) != 0 : std::isdigit(u) != 0;
        };
        if (digits.empty() || !std::all_of(digits.begin(), digits.end(), is_digit)) {
            out.append(t, i, end - i);
            i = end;
            continue;
        }
        uint64_t num = 0;
        for (char ch : digits) {
            int d = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0' : std::tolower(ch) - 'a' + 10;
            num = std::min<uint64_t>(num * (hex ? 16 : 10) + static_cast<uint64_t>(d), 0x110000);  // "too large"
        }
        U32 ch = html_charref(static_cast<char32_t>(num));
        if (ch == U";")
            out.append(t, i, end - i);  // ftfy keeps any result that holds a ';'
        else
            out += ch;
        i = end;
    }
    return out;
}

U32 fix_latin_ligatures(const U32& t) {
    static const std::unordered_map<char32_t, U32> lig = {
        {0x132, U"IJ"},       {0x133, U"ij"},      {0x149, U"\u02bcn"}, {0x1F1, U"DZ"},      {0x1F2, U"Dz"},
        {0x1F3, U"dz"},       {0x1C4, U"D\u017d"}, {0x1C5, U"D\u017e"}, {0x1C6, U"d\u017e"}, {0x1C7, U"LJ"},
        {0x1C8, U"Lj"},       {0x1C9, U"lj"},      {0x1CA, U"NJ"},      {0x1CB, U"Nj"},      {0x1CC, U"nj"},
        {0xFB00, U"ff"},      {0xFB01, U"fi"},     {0xFB02, U"fl"},     {0xFB03, U"ffi"},    {0xFB04, U"ffl"},
        {0xFB05, U"\u017ft"}, {0xFB06, U"st"},
    };
    U32 out;
    for (char32_t c : t) {
        auto it = lig.find(c);
        if (it == lig.end())
            out.push_back(c);
        else
            out += it->second;
    }
    return out;
}

// Full-width and half-width forms -> their NFKC forms; ideographic space -> ' '.
U32 fix_character_width(const U32& t) {
    U32 out;
    for (char32_t c : t) {
        if (c == 0x3000)
            out.push_back(' ');
        else if (c >= 0xFF01 && c <= 0xFFEF)
            out += normalize(U32(1, c), true);
        else
            out.push_back(c);
    }
    return out;
}

U32 uncurl_quotes(U32 t) {
    for (char32_t& c : t) {
        if (c == 0x2BC || (c >= 0x2018 && c <= 0x201B))
            c = '\'';
        else if (c >= 0x201C && c <= 0x201F)
            c = '"';
    }
    return t;
}

U32 fix_line_breaks(const U32& t) {
    U32 out;
    for (size_t i = 0; i < t.size(); ++i) {
        char32_t c = t[i];
        if (c == '\r' && i + 1 < t.size() && t[i + 1] == '\n') continue;  // \r\n -> \n
        out.push_back((c == '\r' || c == 0x2028 || c == 0x2029 || c == 0x85) ? U'\n' : c);
    }
    return out;
}

// ANSI escapes: ESC '[' (digits or ';')* letter.
U32 remove_terminal_escapes(const U32& t) {
    U32 out;
    for (size_t i = 0; i < t.size();) {
        if (t[i] == 0x1B && i + 1 < t.size() && t[i + 1] == '[') {
            size_t j = i + 2;
            while (j < t.size() && (t[j] == ';' || is_decimal_digit(t[j]))) ++j;
            if (j < t.size() && is_ascii_letter(t[j])) {
                i = j + 1;
                continue;
            }
        }
        out.push_back(t[i++]);
    }
    return out;
}

// ftfy keeps \t \n \f \r and C1 controls, drops the other C0 controls, DEL,
// deprecated Arabic format characters, BOM and interlinear annotations.
U32 remove_control_chars(const U32& t) {
    U32 out;
    for (char32_t c : t) {
        bool drop = c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
                    c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
        if (!drop) out.push_back(c);
    }
    return out;
}

// ftfy's fix_and_explain with the default settings, for one line.
U32 fix_segment(U32 text, bool unescape) {
    for (int iter = 0; iter < 100; ++iter) {  // until nothing changes
        U32 orig = text;
        if (unescape) text = unescape_html(text);
        text = fix_encoding_impl(text);
        text = fix_c1_controls(std::move(text));
        text = fix_latin_ligatures(text);
        text = fix_character_width(text);
        text = uncurl_quotes(std::move(text));
        text = fix_line_breaks(text);
        // (fix_surrogates has nothing to do: these strings never hold surrogates)
        text = remove_terminal_escapes(text);
        text = remove_control_chars(text);
        text = normalize(text, false);
        if (text == orig) break;
    }
    return text;
}

}  // namespace

bool is_py_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::u32string utf8_to_u32(const std::string& utf8) {
    U32 out;
    out.reserve(utf8.size());
    auto s = reinterpret_cast<const unsigned char*>(utf8.data());
    for (size_t i = 0; i < utf8.size();) {
        char32_t cp;
        int len = utf8_sequence(s, utf8.size(), i, cp);
        if (len < 0) {
            out.push_back(kReplacement);
            i += -len;
        } else {
            out.push_back(cp);
            i += len;
        }
    }
    return out;
}

std::string u32_to_utf8(const std::u32string& text) {
    std::string out;
    out.reserve(text.size());
    for (char32_t c : text) {
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = kReplacement;
        if (c < 0x80) {
            out.push_back(static_cast<char>(c));
        } else if (c < 0x800) {
            out.push_back(static_cast<char>(0xC0 | (c >> 6)));
            out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
        } else if (c < 0x10000) {
            out.push_back(static_cast<char>(0xE0 | (c >> 12)));
            out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
        } else {
            out.push_back(static_cast<char>(0xF0 | (c >> 18)));
            out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
        }
    }
    return out;
}

std::u32string fix_text(const std::u32string& text) {
    // ftfy fixes line by line; HTML unescaping stops for good at the first
    // line that contains '<' (it may be real HTML).
    constexpr size_t kMaxSegment = 1000000;  // ftfy's max_decode_length
    U32 out;
    bool unescape = true;
    for (size_t pos = 0; pos < text.size();) {
        size_t nl = text.find(U'\n', pos);
        size_t end = nl == U32::npos ? text.size() : nl + 1;
        end = std::min(end, pos + kMaxSegment);
        U32 segment = text.substr(pos, end - pos);
        if (segment.find(U'<') != U32::npos) unescape = false;
        out += fix_segment(std::move(segment), unescape);
        pos = end;
    }
    return out;
}

std::u32string whitespace_clean(const std::u32string& text) {
    U32 out;
    bool pending_space = false;
    for (char32_t c : text) {
        if (is_py_space(c)) {
            pending_space = true;
            continue;
        }
        if (pending_space && !out.empty()) out.push_back(' ');
        pending_space = false;
        out.push_back(c);
    }
    return out;
}

std::u32string to_lower(const std::u32string& text) {
    if (is_ascii(text)) {
        U32 out = text;
        for (char32_t& c : out)
            if (c >= 'A' && c <= 'Z') c += 'a' - 'A';
        return out;
    }
    icu::UnicodeString s = to_icu(text);
    s.toLower(icu::Locale::getRoot());  // full mappings and final sigma, no language rules
    return from_icu(s);
}

std::u32string clean_prompt(const std::string& utf8) { return to_lower(whitespace_clean(fix_text(utf8_to_u32(utf8)))); }

namespace detail {
bool is_bad(const std::u32string& text) { return is_bad_impl(text); }
std::u32string fix_encoding(const std::u32string& text) { return fix_encoding_impl(text); }
}  // namespace detail

}  // namespace sd
