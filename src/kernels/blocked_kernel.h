// Activations in oneDNN's blocked layout (nChw16c with AVX-512, nChw8c with
// AVX2): an image's channels in groups of `block`, [N, C/block, H, W, block],
// the last group zero-padded when C is not a multiple. oneDNN's convolutions
// run 5-25% faster on it at the UNet's shapes and 2-7x at the VAE's large
// layers (bench/conv_routes.cpp), so the ResNet blocks keep their activations
// in it; these are the element-wise kernels between the convolutions, and the
// convolutions themselves, without LibTorch.
#pragma once
#include <cstdint>
#include <string>

namespace sd::kernels {

// Where a 3x3 convolution (stride 1, padding 1) by Winograd F(2x2, 3x3) reads and
// writes: each image of h x w pixels is cut into tiles of 2x2 output pixels, `across`
// in a row and per_image in all, numbered image by image, row by row. A chunk of
// `chunk` consecutive tiles is transformed at a time: V [16][chunk][icp] from the
// input, M [16][chunk][ocp] for the output (icp, ocp: channels padded to the block).
struct WinogradTiles {
    int64_t h = 0, w = 0, across = 0, per_image = 0;
    int64_t icb = 0, ocb = 0, icp = 0, ocp = 0;  // channel blocks, and the padded counts
    int64_t chunk = 0;
};

// One instruction-set build of the element-wise kernels (blocked_kernel_isa.cpp).
// A "plane" is one image's group of `block` channels: hw pixels of `block` floats.
struct BlockedKernel {
    const char* name;
    int block;
    // Per-lane sums over a plane of (x + add[lane]) and of its square (add may be null).
    void (*moments)(const float* x, int64_t hw, const float* add, double* sum, double* sumsq);
    // y = f((x + add[lane]) * scale[lane] + shift[lane]) for `pixels` pixels of one plane,
    // f = SiLU (x * sigmoid(x)) when silu, else identity; y may be x.
    void (*scale_shift)(const float* x, int64_t pixels, const float* add, const float* scale, const float* shift,
                        bool silu, float* y);
    // Nearest 2x upsampling of one plane's rows [row_begin, row_end) of h x w into 2h x 2w.
    void (*upsample2x)(const float* x, int64_t h, int64_t w, float* y, int64_t row_begin, int64_t row_end);
    // Winograd F(2x2, 3x3), the own route where oneDNN has none (blocked_kernel.cpp).
    // U = G g Gᵀ for input block icb of a weight packed by pack_conv_weights (icb_n input
    // and ocb_n output blocks) into u [16][icp][ocp].
    void (*winograd_weights)(const float* packed, int64_t icb, int64_t icb_n, int64_t ocb_n, float* u);
    // V = Bᵀ d B for tiles [t0, t1) of blocked src into v, whose chunk starts at tile chunk_first.
    void (*winograd_input)(const float* src, const WinogradTiles& g, int64_t t0, int64_t t1, int64_t chunk_first,
                           float* v);
    // Y = Aᵀ M A + bias (bias padded to ocp, or null) for tiles [t0, t1) from m into blocked
    // dst, added to what dst holds with accumulate.
    void (*winograd_output)(const float* m, const WinogradTiles& g, int64_t t0, int64_t t1, int64_t chunk_first,
                            const float* bias, bool accumulate, float* dst);
};

// The widest build this CPU runs and oneDNN may use (SD_BLOCKED_ISA=avx2 or
// avx512 asks for one, none for the plain route; DNNL_MAX_CPU_ISA=AVX2 rules AVX-512
// out), or nullptr where none (no AVX2, or no oneDNN in this build): the blocked route
// is then off. A build asked for that this CPU cannot run: a warning, then the widest.
const BlockedKernel* blocked_kernel();
// "" when SD_BLOCKED_ISA is unset, empty, "none" or a build's name; else the one line
// refusing it (a misspelt name would silently change the route a benchmark measures).
std::string blocked_isa_problem();
// The build of that name if this CPU runs it (tests compare them), else nullptr.
const BlockedKernel* blocked_kernel_named(const char* name);

// A convolution on blocked activations, fp32, through oneDNN: src [n, ic, ih, iw]
// and dst [n, oc, oh, ow] in the blocked layout of `block`, weights as
// pack_conv_weights wrote them, bias [oc] or null. With accumulate, dst's values
// are added to the result (the residual add, fused into the convolution).
struct ConvShape {
    int64_t n = 0, ic = 0, oc = 0, ih = 0, iw = 0, kh = 0, kw = 0, stride = 1;
    int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
    int block = 16;
    int64_t oh() const { return (ih + pad_top + pad_bottom - kh) / stride + 1; }
    int64_t ow() const { return (iw + pad_left + pad_right - kw) / stride + 1; }
};
// winograd: null, or a slot make_winograd_slot or make_per_call_winograd_slot made
// for this layer. Block 16: where oneDNN has a Winograd convolution for s, the slot's
// weights are used, transformed for s first if they were made for another size (so a
// result depends on s alone, never on the sizes run before); elsewhere the direct
// weights are. Block 8: the own route, at every size; packed_weights may then be null
// (std::invalid_argument where it would be read). A per-call slot: the own route where
// the call is large enough. Returns whether a Winograd convolution ran.
bool conv_blocked(const ConvShape& s, const float* src, const float* packed_weights, float* winograd,
                  int64_t winograd_floats, const float* bias, float* dst, bool accumulate);

// Winograd F(4x4, 3x3) or F(2x2, 3x3) through oneDNN (its AVX-512 builds, block 16), for
// 3x3 convolutions with stride 1 and padding 1: 2-3x faster than the direct ones at
// the UNet's first two levels, for 4x the weight memory, and results within ~4e-6 of
// the largest output (docs/benchmarks.md). oneDNN lays the transformed weights out
// per problem (batch and image size, even bias and sum, can change it), so a slot
// holds a header naming the size they were made for, and room for the largest layout.
// Block 8 (AVX2, where oneDNN has none): the own F(2x2, 3x3) (blocked_kernel.cpp), 1.6-1.9x
// faster at those layers, its slot the same at every size and 16/9 of the direct weight,
// which it replaces (the operators keep the slot alone).
// Floats of a slot for an [oc, ic, 3, 3] weight in blocks of `block`; 0 where this
// build has no Winograd convolutions (no oneDNN, or no AVX2 for block 8).
int64_t winograd_slot_floats(int64_t oc, int64_t ic, int block);
// Fills a slot from the weight as pack_conv_weights packed it, transformed for s;
// false (and the slot marked empty) where oneDNN has no Winograd convolution for s.
bool make_winograd_slot(const float* packed_weights, const ConvShape& s, float* slot, int64_t slot_floats);
// Whether oneDNN has a Winograd convolution for s (on this CPU, under DNNL_MAX_CPU_ISA).
bool winograd_runs(const ConvShape& s);
// The per-call form (the own F(2x2, 3x3) route, for layers whose resident Winograd
// weights would cost more memory than they save time: the VAE's): a slot of this many
// floats (0 where this build has no own route for the block) holding only a header;
// each call of a large enough image transforms the weights into scratch first, a small
// one runs the direct convolution. make_per_call_winograd_slot writes the header, false
// where s is not a 3x3 convolution with stride 1 and padding 1.
int64_t per_call_winograd_slot_floats(int block);
bool make_per_call_winograd_slot(const ConvShape& s, float* slot);
// Whether `slot` is one make_winograd_slot or make_per_call_winograd_slot made for s's
// layer (its channels and block) and as long.
bool winograd_slot_fits(const float* slot, int64_t slot_floats, const ConvShape& s);

// Floats of a weight [oc, ic, kh, kw] in the blocked weight layout (OIhw16i16o / OIhw8i8o,
// both channel counts padded to the block), and the packing itself (done once, at load).
int64_t packed_conv_weight_floats(int64_t oc, int64_t ic, int64_t kh, int64_t kw, int block);
void pack_conv_weights(const float* w, int64_t oc, int64_t ic, int64_t kh, int64_t kw, int block, float* packed);

// Plain NCHW <-> blocked for n images of c channels (the blocked side padded with zeros).
void to_blocked(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int block, float* y);
void to_plain(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int block, float* y);

}  // namespace sd::kernels
