// The ResNet blocks of the UNet and the VAE on blocked activations
// (src/kernels/blocked_kernel.h): the operators sd_blocked::* that the exported
// ResBlock, ResnetBlock, Upsample and Downsample call when their `blocked`
// attribute is set (python/sd_export/blocked_ops.py has their Python
// definitions). A blocked tensor is a dense fp32 tensor [N, C/block, H, W, block];
// one passed between blocks always has C a multiple of the block (a block whose
// output channels are not writes a plain tensor).
#pragma once
#include <ATen/core/Tensor.h>

#include <c10/util/Optional.h>

namespace sd {

// The channel block of the blocked route on this CPU (16 with AVX-512, 8 with
// AVX2), or 0 where it is off (see kernels::blocked_kernel()).
int blocked_route_block();

// GroupNorm + SiLU, conv3x3, + emb_out per channel, GroupNorm + SiLU, conv3x3,
// + (x, or its 1x1 skip convolution): the UNet's ResBlock (emb_out [N, out]) and
// the VAE's ResnetBlock (no emb_out). x plain [N, in, H, W] or blocked; weights
// plain [out, in, k, k] or packed (pack_conv_weight); `block` 16 or 8.
at::Tensor blocked_resblock(const at::Tensor& x, const c10::optional<at::Tensor>& emb_out, const at::Tensor& norm1_w,
                            const at::Tensor& norm1_b, double eps1, const at::Tensor& conv1_w,
                            const c10::optional<at::Tensor>& conv1_b, const at::Tensor& norm2_w,
                            const at::Tensor& norm2_b, double eps2, const at::Tensor& conv2_w,
                            const c10::optional<at::Tensor>& conv2_b, const c10::optional<at::Tensor>& skip_w,
                            const c10::optional<at::Tensor>& skip_b, int64_t groups, int64_t in_channels,
                            int64_t out_channels, int64_t block, bool plain_out);

// Nearest 2x upsampling, then a 3x3 convolution (padding 1).
at::Tensor blocked_upsample(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b,
                            int64_t channels, int64_t block, bool plain_out);

// A 3x3 convolution with stride 2, padded by pad_begin above and left, pad_end
// below and right (the UNet: 1, 1; the VAE's encoder: 0, 1).
at::Tensor blocked_downsample(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b,
                              int64_t channels, int64_t pad_begin, int64_t pad_end, int64_t block, bool plain_out);

// A 3x3 convolution, stride 1, padding 1, of blocked x (`in` channels, a multiple of
// the block) to `out` channels, blocked; w plain or packed (pack_conv_weight, with or
// without its Winograd form). With `sum` (blocked, the result's shape), the result is
// added to it, in place, and `sum` returned.
at::Tensor blocked_conv3x3(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b, int64_t in,
                           int64_t out, int64_t block, const at::Tensor& sum = {});

// A blocked tensor as plain [N, C, H, W]; a plain one as it is.
at::Tensor blocked_to_plain(const at::Tensor& x);
// A plain tensor in the blocked layout of `block` (channels zero-padded).
at::Tensor plain_to_blocked(const at::Tensor& x, int64_t block);

// The problem a 3x3 layer's Winograd weights are made for (kernels::make_winograd_slot):
// images per pass and the layer's input height and width; rows 0: none. per_call: the
// own route's weights made on each call instead (kernels::make_per_call_winograd_slot),
// where that route runs; no size needed.
struct WinogradSize {
    int64_t rows = 0, height = 0, width = 0;
    bool per_call = false;
};

// A conv weight [out, in, k, k] (fp32) in the blocked weight layout: a 1-D tensor,
// followed, for a 3x3 weight and a WinogradSize where a Winograd convolution runs, by
// a Winograd slot (kernels::make_winograd_slot) holding its weights transformed: for
// oneDNN's (block 16) for that size, transformed again, in place, when the layer runs
// at another size, so that results never depend on the sizes run before. The own
// route's (block 8) are the same at every size and never need the direct weight: the
// slot alone is returned.
at::Tensor pack_conv_weight(const at::Tensor& w, int64_t block, const WinogradSize& winograd = {});
// Whether the blocked route runs Winograd convolutions here: oneDNN's F(4x4, 3x3) on
// AVX-512, the own F(2x2, 3x3) on AVX2 (DNNL_MAX_CPU_ISA=AVX2, SD_BLOCKED_ISA=avx2 or an
// AVX2 CPU); none on the plain route.
bool winograd_available();
// Floats a 3x3 weight's 9 add in that Winograd form (memory::MemoryRequest): 36 beside
// the direct ones (oneDNN's), or 16 - 9 = 7 in their place (the own route's).
double winograd_added_floats();
// Whether a weight pack_conv_weight returned carries a Winograd slot.
bool has_winograd_form(const at::Tensor& packed, int64_t out, int64_t in, int64_t k, int64_t block);

// Registers sd_blocked::* with the dispatcher; safe to call more than once.
void register_blocked_operators();

}  // namespace sd
