// Tile sizes shared by the dispatcher and every instruction-set build of the
// attention kernel (the packed layout depends on them).
#pragma once
#include <cstdint>

namespace sd::kernels {

constexpr int64_t kQueryTile = 64;   // query rows per task
constexpr int64_t kKeyTile = 256;    // keys per online-softmax step
constexpr int64_t kKeyAlign = 32;    // keys padded to this (two AVX-512 vectors)
constexpr int64_t kWidthAlign = 16;  // head width padded to this (one AVX-512 vector)

}  // namespace sd::kernels
