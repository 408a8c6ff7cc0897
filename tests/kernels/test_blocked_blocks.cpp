// The ResNet blocks on blocked activations (src/engine/blocked_operators.h)
// against the same blocks computed with LibTorch's plain operations, for every
// block size this CPU runs (16: AVX-512, 8: AVX2): the UNet's ResBlock with and
// without a channel change (its 1x1 skip convolution), the VAE's ResnetBlock (no
// time embedding), Upsample, the UNet's and the VAE's Downsample; channel counts
// that are not a multiple of the block and odd image sizes included.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/script.h>

#include <numeric>
#include <string>
#include <vector>

#include "engine/blocked_operators.h"
#include "kernels/blocked_kernel.h"

namespace {

std::vector<int64_t> blocks_here() {
    std::vector<int64_t> out;
    if (sd::kernels::blocked_kernel_named("avx512")) out.push_back(16);
    if (sd::kernels::blocked_kernel_named("avx2")) out.push_back(8);
    return out;
}

at::Tensor swish(const at::Tensor& x) { return x * at::sigmoid(x); }

struct Block {
    int64_t in, out, groups;
    double eps;
    bool emb;
    at::Tensor n1w, n1b, c1w, c1b, n2w, n2b, c2w, c2b, sw, sb;
};

Block make_block(int64_t in, int64_t out, int64_t groups, double eps, bool emb) {
    Block b{in, out, groups, eps, emb};
    b.n1w = 1.0 + 0.2 * at::randn({in});
    b.n1b = 0.2 * at::randn({in});
    b.c1w = at::randn({out, in, 3, 3}) / std::sqrt(9.0 * in);
    b.c1b = 0.1 * at::randn({out});
    b.n2w = 1.0 + 0.2 * at::randn({out});
    b.n2b = 0.2 * at::randn({out});
    b.c2w = at::randn({out, out, 3, 3}) / std::sqrt(9.0 * out);
    b.c2b = 0.1 * at::randn({out});
    if (in != out) {
        b.sw = at::randn({out, in, 1, 1}) / std::sqrt(1.0 * in);
        b.sb = 0.1 * at::randn({out});
    }
    return b;
}

at::Tensor reference_resblock(const Block& b, const at::Tensor& x, const at::Tensor& emb_out) {
    auto h = at::conv2d(swish(at::group_norm(x, b.groups, b.n1w, b.n1b, b.eps)), b.c1w, b.c1b, at::IntArrayRef{1},
                        at::IntArrayRef{1});
    if (emb_out.defined()) h = h + emb_out.unsqueeze(2).unsqueeze(3);
    h = at::conv2d(swish(at::group_norm(h, b.groups, b.n2w, b.n2b, b.eps)), b.c2w, b.c2b, at::IntArrayRef{1},
                   at::IntArrayRef{1});
    const auto skip = b.sw.defined() ? at::conv2d(x, b.sw, b.sb) : x;
    return skip + h;
}

at::Tensor blocked_resblock(const Block& b, const at::Tensor& x, const at::Tensor& emb_out, int64_t block, bool packed,
                            bool plain_out) {
    auto w = [&](const at::Tensor& t) { return packed && t.defined() ? sd::pack_conv_weight(t, block) : t; };
    c10::optional<at::Tensor> emb = emb_out.defined() ? c10::optional<at::Tensor>(emb_out) : c10::nullopt;
    c10::optional<at::Tensor> sw = b.sw.defined() ? c10::optional<at::Tensor>(w(b.sw)) : c10::nullopt;
    c10::optional<at::Tensor> sb = b.sb.defined() ? c10::optional<at::Tensor>(b.sb) : c10::nullopt;
    return sd::blocked_resblock(x, emb, b.n1w, b.n1b, b.eps, w(b.c1w), b.c1b, b.n2w, b.n2b, b.eps, w(b.c2w), b.c2b, sw,
                                sb, b.groups, b.in, b.out, block, plain_out);
}

// Largest difference relative to the reference's largest magnitude (at least 1).
double rel_diff(const at::Tensor& got, const at::Tensor& want) {
    EXPECT_EQ(got.sizes(), want.sizes());
    if (got.sizes() != want.sizes()) return 1e30;
    const double scale = std::max(1.0, want.abs().max().item<double>());
    return (got - want).abs().max().item<double>() / scale;
}

constexpr double kTolerance = 2e-5;

struct ResCase {
    int64_t in, out, groups, h, w, n;
    bool emb;
    double eps;
};

}  // namespace

TEST(BlockedBlocks, SomeBlockSizeRunsOnThisCpu) {
    // Every x86-64 CPU these machines have had runs AVX2 at least.
#if defined(__x86_64__)
    EXPECT_FALSE(blocks_here().empty());
    EXPECT_NE(sd::blocked_route_block(), 0);
#endif
}

TEST(BlockedBlocks, LayoutRoundTripPadsWithZeros) {
    at::manual_seed(1);
    for (int64_t block : blocks_here()) {
        for (int64_t c : {4, 16, 20, 36}) {
            const auto x = at::randn({2, c, 7, 5});
            const auto b = sd::plain_to_blocked(x, block);
            ASSERT_EQ(b.dim(), 5);
            EXPECT_EQ(b.size(1), (c + block - 1) / block);
            // Channel k of the plain tensor is lane k % block of group k / block.
            EXPECT_TRUE(at::equal(b.select(1, 0).select(3, 1), x.select(1, 1))) << c;
            const int64_t padded = b.size(1) * block;
            const auto back = sd::blocked_to_plain(b);
            EXPECT_EQ(back.size(1), padded);
            EXPECT_TRUE(at::equal(back.narrow(1, 0, c), x)) << "block " << block << " C " << c;
            if (padded > c) EXPECT_EQ(back.narrow(1, c, padded - c).abs().max().item<float>(), 0.0f);
        }
    }
}

TEST(BlockedBlocks, ResBlocksMatchThePlainOperations) {
    at::manual_seed(2);
    c10::InferenceMode guard;
    const std::vector<ResCase> cases = {
        {32, 32, 32, 8, 8, 2, true, 1e-5},    // UNet ResBlock, same channels: x is the skip
        {32, 64, 32, 7, 7, 2, true, 1e-5},    // UNet ResBlock with a channel change: 1x1 skip conv
        {64, 32, 32, 9, 5, 1, true, 1e-5},    // fewer channels out (the UNet's decoder side)
        {64, 64, 32, 7, 7, 1, false, 1e-6},   // VAE ResnetBlock
        {64, 128, 32, 6, 6, 1, false, 1e-6},  // VAE ResnetBlock with nin_shortcut
        {4, 4, 2, 7, 7, 2, true, 1e-5},       // fewer channels than one block
        {20, 36, 4, 7, 7, 2, true, 1e-5},     // groups across block boundaries, padding both sides
        {36, 20, 4, 5, 9, 1, false, 1e-6},   {16, 16, 8, 1, 1, 3, true, 1e-5},  // one pixel
    };
    for (int64_t block : blocks_here()) {
        for (const auto& c : cases) {
            const std::string where = "block " + std::to_string(block) + " C " + std::to_string(c.in) + "->" +
                                      std::to_string(c.out) + " " + std::to_string(c.h) + "x" + std::to_string(c.w);
            const auto b = make_block(c.in, c.out, c.groups, c.eps, c.emb);
            const auto x = at::randn({c.n, c.in, c.h, c.w}) * 2.0 + 0.5;
            const auto emb = c.emb ? at::randn({c.n, c.out}) : at::Tensor();
            const auto want = reference_resblock(b, x, emb);
            // Plain in, plain out, weights packed at run time and packed beforehand.
            EXPECT_LE(rel_diff(blocked_resblock(b, x, emb, block, false, true), want), kTolerance) << where;
            EXPECT_LE(rel_diff(blocked_resblock(b, x, emb, block, true, true), want), kTolerance) << where;
            // Blocked out where the channels allow it (a padded result comes back plain).
            const auto y = blocked_resblock(b, x, emb, block, true, false);
            EXPECT_EQ(y.dim(), c.out % block == 0 ? 5 : 4) << where;
            EXPECT_LE(rel_diff(sd::blocked_to_plain(y).narrow(1, 0, c.out), want), kTolerance) << where;
            // Blocked in.
            if (c.in % block == 0) {
                const auto xb = sd::plain_to_blocked(x, block);
                EXPECT_LE(rel_diff(blocked_resblock(b, xb, emb, block, true, true), want), kTolerance) << where;
            }
        }
    }
}

TEST(BlockedBlocks, UpsampleAndDownsampleMatchThePlainOperations) {
    at::manual_seed(3);
    c10::InferenceMode guard;
    for (int64_t block : blocks_here()) {
        for (int64_t c : {4, 20, 32, 36}) {
            for (int64_t size : {1, 7, 8}) {
                const std::string where =
                    "block " + std::to_string(block) + " C " + std::to_string(c) + " size " + std::to_string(size);
                const auto x = at::randn({2, c, size, size + 2});
                const auto w = at::randn({c, c, 3, 3}) / std::sqrt(9.0 * c);
                const auto b = 0.1 * at::randn({c});
                const auto packed = sd::pack_conv_weight(w, block);
                const auto xin = c % block == 0 ? sd::plain_to_blocked(x, block) : x;

                const auto up_want = at::conv2d(at::upsample_nearest2d(x, {2 * size, 2 * (size + 2)}), w, b,
                                                at::IntArrayRef{1}, at::IntArrayRef{1});
                EXPECT_LE(rel_diff(sd::blocked_upsample(x, packed, b, c, block, true), up_want), kTolerance) << where;
                const auto up = sd::blocked_upsample(xin, w, b, c, block, false);
                EXPECT_LE(rel_diff(sd::blocked_to_plain(up).narrow(1, 0, c), up_want), kTolerance) << where;

                // The UNet's: padding 1 all round; the VAE encoder's: one row and column below and right.
                const auto down_want = at::conv2d(x, w, b, at::IntArrayRef{2}, at::IntArrayRef{1});
                EXPECT_LE(rel_diff(sd::blocked_downsample(xin, packed, b, c, 1, 1, block, true), down_want), kTolerance)
                    << where;
                if (size > 1) {
                    const auto vae_want =
                        at::conv2d(at::constant_pad_nd(x, {0, 1, 0, 1}), w, b, at::IntArrayRef{2}, at::IntArrayRef{0});
                    EXPECT_LE(rel_diff(sd::blocked_downsample(x, packed, b, c, 0, 1, block, true), vae_want),
                              kTolerance)
                        << where;
                }
            }
        }
    }
}

TEST(BlockedBlocks, BadInputsAreRefusedNotMisread) {
    for (int64_t block : blocks_here()) {
        const auto x = at::randn({1, 32, 4, 4});
        const auto w = at::randn({32, 32, 3, 3});
        EXPECT_THROW(sd::blocked_upsample(x, w, c10::nullopt, 16 + 32, block, true), c10::Error);  // channels
        EXPECT_THROW(sd::blocked_upsample(x, at::randn({7}), c10::nullopt, 32, block, true),
                     c10::Error);  // packed size
        EXPECT_THROW(sd::blocked_upsample(x.to(at::kDouble), w, c10::nullopt, 32, block, true), c10::Error);
        const auto other = block == 16 ? 8 : 16;
        EXPECT_THROW(sd::blocked_upsample(sd::plain_to_blocked(x, block), w, c10::nullopt, 32, other, true),
                     c10::Error);
    }
    EXPECT_THROW(sd::plain_to_blocked(at::randn({1, 4, 4, 4}), 5), c10::Error);
}

// Winograd slots (kernels::make_winograd_slot) on the AVX-512 route: the direct
// convolution's result within float rounding, with or without bias and residual
// sum, at the size the slot was made for and at others; at another size the slot is
// transformed again, so the result is the one a slot made for that size gives, bit
// for bit: never dependent on the sizes run before (a hires pass equals a separate
// img2img run).
sd::kernels::ConvShape conv3x3_shape(int64_t n, int64_t ic, int64_t oc, int64_t h, int64_t w, int64_t block) {
    sd::kernels::ConvShape s;
    s.n = n, s.ic = ic, s.oc = oc, s.ih = h, s.iw = w, s.kh = s.kw = 3;
    s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
    s.block = static_cast<int>(block);
    return s;
}

// Where a packed weight's Winograd slot starts: after the direct weight, or at 0 where
// the slot replaced it (the own route's resident form, block 8).
int64_t slot_offset(const at::Tensor& packed, int64_t oc, int64_t ic, int64_t block) {
    if (packed.numel() == sd::kernels::winograd_slot_floats(oc, ic, static_cast<int>(block))) return 0;
    return sd::kernels::packed_conv_weight_floats(oc, ic, 3, 3, static_cast<int>(block));
}

// The blocks this CPU has Winograd convolutions for: oneDNN's (16, AVX-512) and the own F(2x2, 3x3) (8, AVX2).
std::vector<int64_t> winograd_blocks_here() {
    std::vector<int64_t> out;
    for (const int64_t block : blocks_here())
        if (sd::kernels::winograd_runs(conv3x3_shape(1, 32, 32, 8, 8, block))) out.push_back(block);
    return out;
}

TEST(BlockedBlocks, WinogradConvolutionsMatchTheDirectOnes) {
    if (winograd_blocks_here().empty()) GTEST_SKIP() << "no Winograd convolutions on this CPU or build";
    at::manual_seed(4);
    c10::InferenceMode guard;
    struct Case {
        int64_t n, ic, oc, h, w;
    };
    for (const int64_t block : winograd_blocks_here()) {
        for (const Case& c : std::vector<Case>{{2, 40, 24, 7, 9},
                                               {1, 32, 32, 8, 8},
                                               {1, 320, 320, 16, 12},
                                               {2, 64, 32, 9, 5},
                                               {1, 16, 48, 1, 1},
                                               {1, 12, 20, 2, 3}}) {
            auto shape = [block](int64_t n, int64_t ic, int64_t oc, int64_t h, int64_t w) {
                return conv3x3_shape(n, ic, oc, h, w, block);
            };
            const std::string where = "block " + std::to_string(block) + ", " + std::to_string(c.n) + "x" +
                                      std::to_string(c.ic) + "->" + std::to_string(c.oc) + " " + std::to_string(c.h) +
                                      "x" + std::to_string(c.w);
            const auto w = at::randn({c.oc, c.ic, 3, 3}) / std::sqrt(9.0 * c.ic);
            const auto b = 0.1 * at::randn({c.oc});
            const auto made_for = shape(c.n, c.ic, c.oc, c.h, c.w);
            auto packed = sd::pack_conv_weight(w, block, {c.n, c.h, c.w});
            ASSERT_EQ(sd::has_winograd_form(packed, c.oc, c.ic, 3, block), sd::kernels::winograd_runs(made_for))
                << where;
            if (!sd::has_winograd_form(packed, c.oc, c.ic, 3, block)) continue;
            const int64_t direct = slot_offset(packed, c.oc, c.ic, block);
            // The own route never reads the direct weight again: its slot replaces it.
            EXPECT_EQ(direct == 0, block == 8) << where;
            float* slot = packed.data_ptr<float>() + direct;
            const int64_t slot_floats = packed.numel() - direct;
            ASSERT_TRUE(sd::kernels::winograd_slot_fits(slot, slot_floats, made_for)) << where;

            auto run = [&](const sd::kernels::ConvShape& size, const at::Tensor& weights, const at::Tensor& x,
                           const at::Tensor& residual, bool with_bias, bool accumulate, bool* used) {
                auto dst = accumulate ? sd::plain_to_blocked(residual, block)
                                      : at::zeros({size.n, (c.oc + block - 1) / block, size.ih, size.iw, block});
                const auto xb = sd::plain_to_blocked(x, block);
                float* ws = weights.data_ptr<float>();
                *used = sd::kernels::conv_blocked(size, xb.data_ptr<float>(), direct ? ws : nullptr, ws + direct,
                                                  weights.numel() - direct, with_bias ? b.data_ptr<float>() : nullptr,
                                                  dst.data_ptr<float>(), accumulate);
                return sd::blocked_to_plain(dst).narrow(1, 0, c.oc).clone();
            };
            const auto other = shape(c.n + 1, c.ic, c.oc, c.h + 3, c.w);
            for (const auto& size : {made_for, other, made_for}) {
                const bool is_made_for = size.n == made_for.n && size.ih == made_for.ih;
                const std::string at = where + (is_made_for ? " at its size" : " at another size");
                const auto x = at::randn({size.n, c.ic, size.ih, size.iw});
                const auto want = at::conv2d(x, w, b, at::IntArrayRef{1}, at::IntArrayRef{1});
                const auto residual = at::randn_like(want);
                // The same call with a slot made for this size from the start.
                const auto fresh = sd::pack_conv_weight(w, block, {size.n, size.ih, size.iw});
                for (const bool with_bias : {true, false}) {
                    for (const bool accumulate : {false, true}) {
                        const std::string what = at + (with_bias ? ", bias" : "") + (accumulate ? ", sum" : "");
                        bool used = false, used_fresh = false;
                        const auto got = run(size, packed, x, residual, with_bias, accumulate, &used);
                        // Bias and no sum: the layout the slot is made in, so the slot runs wherever oneDNN has
                        // Winograd.
                        if (with_bias && !accumulate) EXPECT_EQ(used, sd::kernels::winograd_runs(size)) << what;
                        auto expect = with_bias ? want : want - b.view({1, -1, 1, 1});
                        if (accumulate) expect = expect + residual;
                        EXPECT_LE(rel_diff(got, expect), kTolerance) << what;
                        if (sd::has_winograd_form(fresh, c.oc, c.ic, 3, block)) {
                            EXPECT_TRUE(
                                at::equal(got, run(size, fresh, x, residual, with_bias, accumulate, &used_fresh)))
                                << what << ": differs from a slot made for this size";
                            EXPECT_EQ(used, used_fresh) << what;
                        }
                    }
                }
                EXPECT_TRUE(sd::kernels::winograd_slot_fits(slot, slot_floats, made_for)) << at;
            }
            // A ResBlock whose convolutions carry Winograd slots gives the plain operations' result.
            const auto blk = make_block(c.ic, c.oc, std::gcd(std::gcd(c.ic, c.oc), int64_t{8}), 1e-5, true);
            const auto x = at::randn({c.n, c.ic, c.h, c.w});
            const auto emb = at::randn({c.n, c.oc});
            const sd::WinogradSize size{c.n, c.h, c.w};
            c10::optional<at::Tensor> sw =
                blk.sw.defined() ? c10::optional<at::Tensor>(sd::pack_conv_weight(blk.sw, block)) : c10::nullopt;
            c10::optional<at::Tensor> sb = blk.sb.defined() ? c10::optional<at::Tensor>(blk.sb) : c10::nullopt;
            const auto got =
                sd::blocked_resblock(x, emb, blk.n1w, blk.n1b, blk.eps, sd::pack_conv_weight(blk.c1w, block, size),
                                     blk.c1b, blk.n2w, blk.n2b, blk.eps, sd::pack_conv_weight(blk.c2w, block, size),
                                     blk.c2b, sw, sb, blk.groups, blk.in, blk.out, block, true);
            EXPECT_LE(rel_diff(got, reference_resblock(blk, x, emb)), kTolerance) << where << " ResBlock";
        }
    }
}

// The per-call form (the VAE's: a slot of a header only, the own F(2x2, 3x3) route's
// weights made on each call): the direct convolution's result within float rounding
// where it runs, with or without bias and residual sum, odd sizes and channel counts
// that are not a multiple of the block included; a small image runs the direct
// convolution, bit for bit; a large one (256 channels, 768 tiles) gives each thread
// chunks of its own. A VAE ResnetBlock and Upsample carrying such weights give
// the plain operations' result.
TEST(BlockedBlocks, PerCallWinogradMatchesTheDirectConvolution) {
    at::manual_seed(5);
    c10::InferenceMode guard;
    int ran = 0;
    for (const int64_t block : blocks_here()) {
        if (sd::kernels::per_call_winograd_slot_floats(static_cast<int>(block)) == 0) continue;
        struct Case {
            int64_t n, ic, oc, h, w;
        };
        for (const Case& c : std::vector<Case>{{1, 40, 24, 33, 35},
                                               {2, 32, 32, 24, 24},
                                               {1, 16, 48, 64, 8},
                                               {1, 32, 32, 6, 6},
                                               {1, 256, 256, 64, 48}}) {
            const std::string where = "block " + std::to_string(block) + ", " + std::to_string(c.n) + "x" +
                                      std::to_string(c.ic) + "->" + std::to_string(c.oc) + " " + std::to_string(c.h) +
                                      "x" + std::to_string(c.w);
            const auto s = conv3x3_shape(c.n, c.ic, c.oc, c.h, c.w, block);
            const auto w = at::randn({c.oc, c.ic, 3, 3}) / std::sqrt(9.0 * c.ic);
            const auto b = 0.1 * at::randn({c.oc});
            sd::WinogradSize per_call;
            per_call.per_call = true;
            const auto packed = sd::pack_conv_weight(w, block, per_call);
            ASSERT_TRUE(sd::has_winograd_form(packed, c.oc, c.ic, 3, block)) << where;
            const auto plain = sd::pack_conv_weight(w, block);
            const int64_t direct = plain.numel();
            ASSERT_EQ(packed.numel(), direct + sd::kernels::per_call_winograd_slot_floats(static_cast<int>(block)));
            ASSERT_TRUE(sd::kernels::winograd_slot_fits(packed.data_ptr<float>() + direct, packed.numel() - direct, s))
                << where;
            const auto x = at::randn({c.n, c.ic, c.h, c.w});
            const auto xb = sd::plain_to_blocked(x, block);
            const auto want = at::conv2d(x, w, b, at::IntArrayRef{1}, at::IntArrayRef{1});
            const auto residual = at::randn_like(want);
            for (const bool with_bias : {true, false}) {
                for (const bool accumulate : {false, true}) {
                    const std::string what = where + (with_bias ? ", bias" : "") + (accumulate ? ", sum" : "");
                    auto run = [&](const at::Tensor& weights, bool* used) {
                        auto dst = accumulate ? sd::plain_to_blocked(residual, block)
                                              : at::zeros({c.n, (c.oc + block - 1) / block, c.h, c.w, block});
                        float* ws = weights.data_ptr<float>();
                        const bool slot = weights.numel() > direct;
                        *used = sd::kernels::conv_blocked(s, xb.data_ptr<float>(), ws, slot ? ws + direct : nullptr,
                                                          slot ? weights.numel() - direct : 0,
                                                          with_bias ? b.data_ptr<float>() : nullptr,
                                                          dst.data_ptr<float>(), accumulate);
                        return sd::blocked_to_plain(dst).narrow(1, 0, c.oc).clone();
                    };
                    bool used = false, used_direct = false;
                    const auto got = run(packed, &used);
                    const auto direct_result = run(plain, &used_direct);
                    EXPECT_FALSE(used_direct) << what;
                    auto expect = with_bias ? want : want - b.view({1, -1, 1, 1});
                    if (accumulate) expect = expect + residual;
                    EXPECT_LE(rel_diff(got, expect), kTolerance) << what;
                    if (used) {
                        ++ran;
                        EXPECT_FALSE(at::equal(got, direct_result)) << what << ": the direct convolution ran";
                    } else {
                        EXPECT_TRUE(at::equal(got, direct_result)) << what;
                    }
                }
            }
            // The small image runs directly; the large ones by Winograd.
            if (c.h * c.w * c.n >= 1024) EXPECT_GT(ran, 0) << where;
        }
        // VAE-like blocks holding per-call weights, at a size where the route runs.
        const auto blk = make_block(64, 32, 32, 1e-6, false);
        const auto x = at::randn({1, 64, 40, 36});
        auto per_call = [&](const at::Tensor& t) {
            sd::WinogradSize pc;
            pc.per_call = true;
            return sd::pack_conv_weight(t, block, pc);
        };
        const auto got =
            sd::blocked_resblock(x, c10::nullopt, blk.n1w, blk.n1b, blk.eps, per_call(blk.c1w), blk.c1b, blk.n2w,
                                 blk.n2b, blk.eps, per_call(blk.c2w), blk.c2b, sd::pack_conv_weight(blk.sw, block),
                                 blk.sb, blk.groups, blk.in, blk.out, block, true);
        EXPECT_LE(rel_diff(got, reference_resblock(blk, x, at::Tensor())), kTolerance) << "block " << block;
        const auto uw = at::randn({32, 32, 3, 3}) / std::sqrt(9.0 * 32);
        const auto ub = 0.1 * at::randn({32});
        const auto ux = at::randn({1, 32, 20, 18});
        const auto up_want =
            at::conv2d(at::upsample_nearest2d(ux, {40, 36}), uw, ub, at::IntArrayRef{1}, at::IntArrayRef{1});
        EXPECT_LE(rel_diff(sd::blocked_upsample(ux, per_call(uw), ub, 32, block, true), up_want), kTolerance)
            << "block " << block;
    }
    if (ran == 0) GTEST_SKIP() << "no own Winograd route on this CPU";
}

TEST(BlockedBlocks, WinogradSlotsOfAnotherLayerAreRefused) {
    if (winograd_blocks_here().empty()) GTEST_SKIP() << "no Winograd convolutions on this CPU or build";
    for (const int64_t block : winograd_blocks_here()) {
        const auto w = at::randn({32, 32, 3, 3});
        const auto packed = sd::pack_conv_weight(w, block, {1, 8, 8});
        ASSERT_TRUE(sd::has_winograd_form(packed, 32, 32, 3, block));
        const int64_t direct = slot_offset(packed, 32, 32, block);
        const float* slot = packed.data_ptr<float>() + direct;
        const int64_t floats = packed.numel() - direct;
        sd::kernels::ConvShape s;
        s.n = 1, s.ic = s.oc = 32, s.ih = s.iw = 8, s.kh = s.kw = 3;
        s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
        s.block = static_cast<int>(block);
        EXPECT_TRUE(sd::kernels::winograd_slot_fits(slot, floats, s));
        EXPECT_FALSE(sd::kernels::winograd_slot_fits(slot, floats - 1, s));  // cut short
        auto other = s;
        other.oc = 48;
        EXPECT_FALSE(sd::kernels::winograd_slot_fits(slot, floats, other));
        const auto garbage = at::randn({floats});
        EXPECT_FALSE(sd::kernels::winograd_slot_fits(garbage.data_ptr<float>(), floats, s));
        // The operators check the same before reading: a weight with 16 floats more than its layer's.
        const auto x = at::randn({1, 32, 8, 8});
        EXPECT_THROW(sd::blocked_upsample(x, at::cat({packed, at::zeros({16})}), c10::nullopt, 32, block, true),
                     c10::Error);
    }
}
