// bfloat16 <-> float on raw bits, for the kernels that take bf16 arrays
// without LibTorch (a bf16 is the top half of a float).
#pragma once
#include <cstdint>
#include <cstring>

namespace sd::kernels {

inline float bf16_to_float(uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Rounds to nearest, ties to even, as LibTorch's c10::BFloat16 does; a NaN stays a NaN.
inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

}  // namespace sd::kernels
