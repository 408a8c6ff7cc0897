#include "engine/brownian_tree.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "sd/error.h"

namespace sd {

namespace {

// numpy's bit_generator.pyx constants.
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    value ^= value >> kXShift;
    return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = kMixMultL * x - kMixMultR * y;
    result ^= result >> kXShift;
    return result;
}

// _int_to_uint32_array: the 32-bit words of n, least significant first; [0] for 0.
void append_words(uint64_t n, std::vector<uint32_t>& out) {
    if (n == 0) out.push_back(0);
    for (; n > 0; n >>= 32) out.push_back(static_cast<uint32_t>(n & 0xffffffffu));
}

// The tree's settings as k-diffusion leaves them (torchsde's BrownianTree defaults).
constexpr int kPoolSize = 24;

}  // namespace

std::vector<uint32_t> seed_sequence_state(uint64_t entropy, const std::vector<uint64_t>& spawn_key, int pool_size,
                                          int n_words) {
    std::vector<uint32_t> assembled, spawn;
    append_words(entropy, assembled);
    for (uint64_t k : spawn_key) append_words(k, spawn);
    // With a spawn key the run entropy is padded to the pool size (numpy >= 1.19).
    if (!spawn.empty() && assembled.size() < static_cast<size_t>(pool_size)) assembled.resize(pool_size, 0);
    assembled.insert(assembled.end(), spawn.begin(), spawn.end());

    std::vector<uint32_t> pool(static_cast<size_t>(pool_size));
    uint32_t hash_const = kInitA;
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = hashmix(i < assembled.size() ? assembled[i] : 0, hash_const);
    for (size_t src = 0; src < pool.size(); ++src)
        for (size_t dst = 0; dst < pool.size(); ++dst)
            if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    for (size_t src = pool.size(); src < assembled.size(); ++src)
        for (size_t dst = 0; dst < pool.size(); ++dst) pool[dst] = mix(pool[dst], hashmix(assembled[src], hash_const));

    std::vector<uint32_t> state(static_cast<size_t>(n_words));
    uint32_t hc = kInitB;
    for (size_t i = 0; i < state.size(); ++i) {
        uint32_t v = pool[i % pool.size()];
        v ^= hc;
        hc *= kMultB;
        v *= hc;
        v ^= v >> kXShift;
        state[i] = v;
    }
    return state;
}

double round6(double x) {
    // printf rounds the exact binary value half to even, as Python's round does.
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.6f", x);
    return std::strtod(buf, nullptr);
}

BrownianTree::BrownianTree(double t0, double t1, uint64_t entropy, std::vector<int64_t> size, SeededRandn randn)
    : size_(std::move(size)), entropy_(entropy), randn_(std::move(randn)) {
    if (!(t0 <= t1)) throw Error("a Brownian tree needs t0 <= t1");
    Node root;
    root.start = round6(t0);
    root.end = round6(t1);
    // The top increment is scaled by the unrounded length.
    const uint32_t w_seed = seed_sequence_state(entropy_, {}, kPoolSize, 3)[0];
    root.w = randn_(w_seed, size_) * std::sqrt(t1 - t0);
    nodes_.push_back(std::move(root));
}

// _split_exact: children [start, m] and [m, end] at the rounded midway m, and
// the node's seed from its place (spawn key, depth) in the tree.
void BrownianTree::split_exact(int node, double midway) {
    const double m = round6(midway);
    Node& n = nodes_[static_cast<size_t>(node)];
    n.split = true;
    n.midway = m;
    n.w_seed = seed_sequence_state(entropy_, {n.spawn_key, n.depth}, kPoolSize, 4)[0];
    Node left, right;
    left.start = n.start;
    left.end = m;
    right.start = m;
    right.end = n.end;
    left.parent = right.parent = node;
    left.is_left = true;
    left.spawn_key = 2 * n.spawn_key;
    right.spawn_key = 2 * n.spawn_key + 1;
    left.depth = right.depth = n.depth + 1;
    n.left = static_cast<int>(nodes_.size());
    n.right = n.left + 1;
    nodes_.push_back(std::move(left));  // n is not used after this
    nodes_.push_back(std::move(right));
}

// _split with halfway_tree: always at the halfway point, then on down until
// `point` is an edge.
void BrownianTree::split_towards(int node, double point) {
    const Node& n = nodes_[static_cast<size_t>(node)];
    split_exact(node, 0.5 * (n.end + n.start));
    const Node& now = nodes_[static_cast<size_t>(node)];
    if (point > now.midway)
        split_towards(now.right, point);
    else if (point < now.midway)
        split_towards(now.left, point);
}

// _loc_inner: the nodes whose union is [ta, tb], left to right.
void BrownianTree::locate(int node, double ta, double tb, std::vector<int>& out) {
    const Node& n = nodes_[static_cast<size_t>(node)];
    if (ta < n.start || tb > n.end) return locate(n.parent, ta, tb, out);
    if (ta == n.start && tb == n.end) {
        out.push_back(node);
        return;
    }
    if (!n.split) {
        const bool from_start = ta == n.start;
        split_towards(node, from_start ? tb : ta);
        const Node& now = nodes_[static_cast<size_t>(node)];
        return locate(from_start ? now.left : now.right, ta, tb, out);
    }
    const int left = n.left, right = n.right;
    const double m = n.midway;
    if (tb <= m) return locate(left, ta, tb, out);
    if (ta >= m) return locate(right, ta, tb, out);
    locate(left, ta, m, out);
    locate(right, m, tb, out);
}

// A child's increment from its parent's: the Brownian bridge at the parent's
// midway with the parent's seed (_increment_and_space_time_levy_area without H).
const at::Tensor& BrownianTree::w_of(int node) {
    if (nodes_[static_cast<size_t>(node)].w.defined()) return nodes_[static_cast<size_t>(node)].w;
    const int parent = nodes_[static_cast<size_t>(node)].parent;
    const at::Tensor pw = w_of(parent);
    const Node& p = nodes_[static_cast<size_t>(parent)];
    const double h_reciprocal = 1 / (p.end - p.start);
    const double left_diff = p.midway - p.start;
    const double right_diff = p.end - p.midway;
    const at::Tensor mean = left_diff * pw * h_reciprocal;
    const double var = left_diff * right_diff * h_reciprocal;
    const at::Tensor left_w = mean + std::sqrt(var) * randn_(p.w_seed, size_);
    Node& n = nodes_[static_cast<size_t>(node)];
    n.w = n.is_left ? left_w : pw - left_w;
    ++cached_;
    return n.w;
}

at::Tensor BrownianTree::increment(double ta, double tb) {
    const double start = nodes_[0].start, end = nodes_[0].end;
    // torchsde clamps (with a warning) before rounding.
    ta = std::min(std::max(ta, start), end);
    tb = std::min(std::max(tb, start), end);
    if (ta > tb) throw Error("a Brownian tree query needs ta <= tb");
    ta = round6(ta);
    tb = round6(tb);
    // Equal once rounded: no motion (torchsde would divide by a zero length).
    if (ta == tb) return at::zeros(size_, at::kFloat);
    // The increments are recomputed from the root when needed again; a cap of
    // about 64 MiB keeps large latents from piling up (torchsde keeps an LRU
    // cache of 45 nodes). A query needs a path of some 25 nodes.
    const size_t per_node = static_cast<size_t>(std::max<int64_t>(nodes_[0].w.numel(), 1));
    const size_t cap = std::max<size_t>(128, (size_t{1} << 24) / per_node);
    if (cached_ > cap) {
        for (size_t i = 1; i < nodes_.size(); ++i) nodes_[i].w = at::Tensor();
        cached_ = 0;
    }
    std::vector<int> pieces;
    locate(0, ta, tb, pieces);
    at::Tensor w = w_of(pieces[0]);
    for (size_t i = 1; i < pieces.size(); ++i) w = w + w_of(pieces[i]);
    return w;
}

}  // namespace sd
