// Bounds on the numbers a user gives, the same whether they come from a flag
// or from a line of a JSONL prompt file: a value outside them is refused with
// one line naming where it came from, before anything loads or runs.
#pragma once
#include <cstdint>
#include <string>

namespace sd {

struct WholeRange {
    int64_t lo, hi;
};

constexpr WholeRange kStepsRange{1, 10000};       // the model's schedule may allow fewer (Pipeline::check)
constexpr WholeRange kSideRange{1, 65536};        // --H, --W; the model needs a multiple of its size_multiple
constexpr WholeRange kIterRange{1, 1000000};      // --n_iter
constexpr WholeRange kSamplesRange{1, 4096};      // --n_samples, --batch-size
constexpr double kMinScale = 0, kMaxScale = 100;  // guidance scale, as model.json's guidance_scale

// v itself when lo <= v <= hi; otherwise throws sd::Error
// "<what> must be a whole number from lo to hi, got v".
int64_t check_whole(const std::string& what, int64_t v, WholeRange r);

// v itself when it is finite and within [kMinScale, kMaxScale]; otherwise throws sd::Error.
double check_scale(const std::string& what, double v);

// A seed: a decimal whole number from 0 to 2^64 - 1, taken exactly (never
// clamped). Throws sd::Error naming `what` otherwise.
uint64_t parse_seed(const std::string& what, const std::string& text);

// CPU threads: 0 (one per usable CPU) up to max_threads(). Throws sd::Error giving the limit.
int check_threads(int64_t threads);

// Clip skip in AUTOMATIC1111's numbering against the text encoder's layers
// (model.json text_layers_used; 0 when not recorded): 1 .. layers + 1, where
// layers + 1 leaves the token and position embeddings alone. Throws sd::Error.
void check_clip_skip(const std::string& what, int64_t clip_skip, int text_layers);
int max_threads();

// Two whole numbers "AxB" (--original-size, --target-size: width x height) or
// "A,B" (--crop-coords: top, left), each from `lo` to kSideRange.hi. Throws
// sd::Error naming `what` and the text otherwise.
struct WholePair {
    int first = 0, second = 0;
};
WholePair parse_whole_pair(const std::string& what, const std::string& text, char separator, int64_t lo);

// Well-formed UTF-8: no overlong forms, surrogates or code points past U+10FFFF.
bool is_valid_utf8(const std::string& s);

}  // namespace sd
