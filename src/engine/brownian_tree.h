// torchsde's BrownianTree (google-research/torchsde v0.2.6, _brownian/
// derived.py and brownian_interval.py), the Brownian motion behind
// k-diffusion's BrownianTreeNoiseSampler: a dyadic tree over [t0, t1] whose
// node increments come from seeds that numpy's SeedSequence derives from the
// tree's entropy and the node's place, so W(ta, tb) depends only on the
// entropy and the query, not on earlier queries. Only what k-diffusion uses:
// tol 1e-6 (times rounded to 6 decimals), pool size 24, the halfway tree, no
// Levy area.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

namespace sd {

// numpy's SeedSequence(entropy, spawn_key=spawn_key, pool_size=pool_size)
// .generate_state(n_words): the 32-bit words of its hash-mix pool.
std::vector<uint32_t> seed_sequence_state(uint64_t entropy, const std::vector<uint64_t>& spawn_key, int pool_size,
                                          int n_words);

// Python's round(x, 6): the nearest 6-decimal number, as a double.
double round6(double x);

// A standard normal float32 tensor of this size from a fresh generator seeded
// `seed` (torchsde's _randn: torch.randn(size, generator=Generator().manual_seed(seed))).
using SeededRandn = std::function<at::Tensor(uint64_t seed, at::IntArrayRef size)>;

class BrownianTree {
public:
    // torchsde.BrownianTree(t0, w0 = zeros(size), t1, entropy); t0 <= t1.
    BrownianTree(double t0, double t1, uint64_t entropy, std::vector<int64_t> size, SeededRandn randn);

    // W(tb) - W(ta) for ta <= tb, each clamped to the tree's (rounded) ends.
    at::Tensor increment(double ta, double tb);
    // W over the whole interval.
    const at::Tensor& top() const { return nodes_[0].w; }

private:
    struct Node {
        double start, end;  // rounded
        int parent = -1;    // index; -1 for the root
        bool is_left = false;
        uint64_t spawn_key = 0;
        uint64_t depth = 0;
        // Set once split:
        bool split = false;
        double midway = 0;
        uint32_t w_seed = 0;
        int left = -1, right = -1;
        at::Tensor w;  // the increment over [start, end], computed on demand
    };

    void split_exact(int node, double midway);
    void split_towards(int node, double point);
    void locate(int node, double ta, double tb, std::vector<int>& out);
    const at::Tensor& w_of(int node);

    std::vector<int64_t> size_;
    uint64_t entropy_;
    SeededRandn randn_;
    std::vector<Node> nodes_;
    size_t cached_ = 0;  // nodes holding a w besides the root
};

}  // namespace sd
