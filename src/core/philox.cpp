#include "core/philox.h"

#include <cmath>

namespace sd {

namespace {

constexpr uint32_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;    // Philox 4x32 multipliers
constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;  // key increments per round

// The reference's constants are float32 numbers (2^-32, and 2^-32 times float32's 2 pi);
// its arithmetic on them is float64, because numpy promotes uint32 times float32 to float64.
const double kInv32 = static_cast<double>(2.3283064e-10f);
const double kInv32TwoPi = static_cast<double>(static_cast<float>(2.3283064e-10 * 6.2831855));

inline void round_once(uint32_t c[4], const uint32_t k[2]) {
    const uint64_t p0 = static_cast<uint64_t>(c[0]) * kMul0;
    const uint64_t p1 = static_cast<uint64_t>(c[2]) * kMul1;
    const uint32_t c1 = c[1], c3 = c[3];
    c[0] = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k[0];
    c[1] = static_cast<uint32_t>(p1);
    c[2] = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k[1];
    c[3] = static_cast<uint32_t>(p0);
}

}  // namespace

void philox4x32_10(uint32_t c[4], uint32_t k[2]) {
    for (int r = 0; r < 9; ++r) {
        round_once(c, k);
        k[0] += kWeyl0;
        k[1] += kWeyl1;
    }
    round_once(c, k);
}

void PhiloxGenerator::randn(float* out, size_t n) {
    // Element j of this call: counter (offset, 0, j, 0), key (low, high word of the seed).
    const uint32_t offset = static_cast<uint32_t>(offset_);
    for (size_t j = 0; j < n; ++j) {
        uint32_t c[4] = {offset, 0, static_cast<uint32_t>(j), 0};
        uint32_t k[2] = {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
        philox4x32_10(c, k);
        // Box-Muller's first output; c[2] and c[3] are not used.
        const double u = static_cast<double>(c[0]) * kInv32 + static_cast<double>(static_cast<float>(kInv32) / 2);
        const double v =
            static_cast<double>(c[1]) * kInv32TwoPi + static_cast<double>(static_cast<float>(kInv32TwoPi) / 2);
        const double s = std::sqrt(-2.0 * std::log(u));
        out[j] = static_cast<float>(s * std::sin(v));
    }
    ++offset_;
}

std::vector<float> PhiloxGenerator::randn(size_t n) {
    std::vector<float> out(n);
    randn(out.data(), n);
    return out;
}

}  // namespace sd
