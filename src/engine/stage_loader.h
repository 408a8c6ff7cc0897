// Loading the exported TorchScript stages and choosing their attention strategy.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/script.h>

#include "engine/blocked_operators.h"
#include "sd/memory_plan.h"

namespace sd {

// torch::jit::load with a one-line sd::Error naming the file when it is
// missing, truncated or not a TorchScript module. The floating-point weights
// are then held as `weights` (kFloat: an fp16 file is widened; kHalf: the
// layers widen each weight as they run, docs/model-format.md), and moved to
// `device` after that conversion, so a GPU never holds the file's own dtype.
// `replace` (--vae) gives tensors that stand in for the weight file's of the
// same names, already checked against its shapes (vae_override.h). They must
// be inference tensors, like the mapped ones beside them (the stage loads in
// the run's InferenceMode, whose tensors and others cannot be swapped).
// `edit` (LoRA merging) then changes the weights, before the conversion to `weights`.
using StageEdit = std::function<void(torch::jit::Module&)>;
torch::jit::Module load_stage(const std::string& path, at::ScalarType weights = at::kFloat,
                              c10::Device device = c10::kCPU,
                              const std::map<std::string, at::Tensor>* replace = nullptr,
                              const StageEdit& edit = nullptr);

// The checks load_stage makes on a stage's files, without loading them (the .pt's
// archive directory, its code against the operations this tool's export emits
// (src/io/code_check.h), its recorded parameter shapes, the .weights header):
// milliseconds, so every stage is checked before the first one runs and a
// broken VAE file is not found only after sampling. Throws sd::Error.
void check_stage_files(const std::string& path);

// Sets the strategy on every attention module inside m (the int attributes
// attention_mode / attention_chunk of docs/model-format.md).
void set_attention(torch::jit::Module& m, const AttentionSetting& a);

// Sets the feed-forward token chunk (ff_chunk, 0 = all tokens) and the conv
// weight bytes per call (conv_split, 0 = whole) on every layer that has them.
void set_layer_memory(torch::jit::Module& m, int ff_chunk, int64_t conv_split);

// Replaces the weight of every 3x3 (or larger) convolution of m, where the
// layer can take it (python/sd_export/modules/layers.py Conv2d), by oneDNN's blocked layout, once:
// LibTorch 1.13 otherwise reorders each weight on every call. Only for fp32
// weights on the CPU, or bf16 ones where the CPU has bf16 instructions; the file pages of each dense weight are handed
// back as it is replaced, so memory does not grow. Returns the count replaced.
// latent_h, latent_w (> 0): the latent size the UNet or VAE is about to run at; a bf16 3x3
// layer that sd::conv3x3 will run by Winograd at that size (the layer's `latent_div` or
// `latent_mul` says where it runs) keeps its plain weight, which that route reads.
int prepack_convolutions(torch::jit::Module& m, int64_t latent_h = 0, int64_t latent_w = 0);

// Switches every module of m that can run as one blocked operator (the
// `blocked` attribute: ResBlock, ResnetBlock, Upsample, Downsample of
// python/sd_export/modules/) to the blocked route of this CPU
// (src/engine/blocked_operators.h): its convolution weights are packed into the
// blocked weight layout once, here, and `blocked` is set to the block. Only fp32
// weights on the CPU, where the CPU has a blocked route. Returns the count switched.
// Run before prepack_convolutions, which then packs the convolutions left.
// With `winograd`, the 3x3 stride-1 convolutions whose output channels one of its
// levels names (a UNet level's width) also get their Winograd form for that level's
// size (blocked_operators.h; where two levels share a width, the last one's: the
// other's layers then run it only where oneDNN's layout allows, else directly);
// winograd_layers counts them.
// With per_call, every 3x3 stride-1 convolution gets the per-call form instead (the
// VAE's: no weights held, kernels::make_per_call_winograd_slot).
struct WinogradChoice {
    std::vector<std::pair<int64_t, WinogradSize>> levels;  // output channels, the size they run at
    bool per_call = false;
};
int prepack_blocked(torch::jit::Module& m, const WinogradChoice& winograd = {}, int* winograd_layers = nullptr);

// Sets `fused_rows` to 1 on every module of m that has it (GEGLU in
// python/sd_export/modules/unet.py): fp32 then runs its one-pass row operators
// (src/engine/operators.h) too, not LibTorch's several passes. The loader does
// it with the prepacked route only, so --prepack off stays the reference. Returns the count.
int use_fused_rows(torch::jit::Module& m);

// The first line of a LibTorch error, without its C++ backtrace.
std::string short_message(const c10::Error& e);

// The last line of an error raised inside TorchScript code: the text is a
// traceback of the scripted source, and its last line ("RuntimeError: ...")
// is the one that says what went wrong.
std::string script_error_line(const std::string& what);

}  // namespace sd
