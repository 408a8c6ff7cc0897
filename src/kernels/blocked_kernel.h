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
void conv_blocked(const ConvShape& s, const float* src, const float* packed_weights, const float* bias, float* dst,
                  bool accumulate);

// Floats of a weight [oc, ic, kh, kw] in the blocked weight layout (OIhw16i16o / OIhw8i8o,
// both channel counts padded to the block), and the packing itself (done once, at load).
int64_t packed_conv_weight_floats(int64_t oc, int64_t ic, int64_t kh, int64_t kw, int block);
void pack_conv_weights(const float* w, int64_t oc, int64_t ic, int64_t kh, int64_t kw, int block, float* packed);

// Plain NCHW <-> blocked for n images of c channels (the blocked side padded with zeros).
void to_blocked(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int block, float* y);
void to_plain(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, int block, float* y);

}  // namespace sd::kernels
