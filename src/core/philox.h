// The web UI's "NV" random source: AUTOMATIC1111's CPU imitation of
// torch.randn on an NVIDIA GPU (modules/rng_philox.py), which is what makes a
// GPU seed's picture remakable on a CPU. Philox 4x32 with 10 rounds in
// cuRAND's layout, then the first output of a Box-Muller transform.
// No LibTorch: plain numbers in, plain floats out.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sd {

class PhiloxGenerator {
public:
    explicit PhiloxGenerator(uint64_t seed) : seed_(seed) {}

    // The next call's n standard normal values. Every call, whatever its size,
    // moves the generator on by one (its offset), as the GPU's torch.randn
    // does per tensor; value j of a call depends only on (seed, offset, j).
    std::vector<float> randn(size_t n);
    void randn(float* out, size_t n);

    uint64_t seed() const { return seed_; }
    uint64_t offset() const { return offset_; }

private:
    uint64_t seed_;
    uint64_t offset_ = 0;
};

// The 4 words Philox 4x32-10 gives for counter c and key k (exposed for tests).
void philox4x32_10(uint32_t c[4], uint32_t k[2]);

}  // namespace sd
