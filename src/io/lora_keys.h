// A LoRA file's modules and the model parameters they change, from its
// .safetensors header alone (no LibTorch): kohya / A1111 files (lora_unet_* /
// lora_te_* with lora_down, lora_up and alpha, LoCon included; SDXL's lora_te1_* /
// lora_te2_*), LyCORIS's LoHa and LoKr modules and LoCon's CP middle (lora_mid)
// under those names, and diffusers' pre-PEFT files (unet.*.lora.{down,up}.weight,
// text_encoder.*.lora_linear_layer.*, SDXL's text_encoder_2.*).
// Names are matched against the model's own weight files, so a LoRA for another
// model (other widths, a linear proj_in on a 1x1-conv UNet, an open_clip text
// encoder) is refused here, before any stage loads. docs/model-format.md.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/weight_file.h"

namespace sd {

class TensorReader;

// How a module builds its change D of a weight W (W' = W + m * scale() * D, A1111's
// and LyCORIS's rules; src/engine/lora_merge.cpp computes it, docs/model-format.md):
// - lora: up.flatten(1) @ down.flatten(1); with a LoCon "mid" [r, r, kh, kw], the
//   CP product of up, mid and down;
// - loha: (w1_a @ w1_b) * (w2_a @ w2_b), elementwise; a factor with a "t1" / "t2"
//   is the CP product of its t, a and b instead;
// - lokr: kron(w1, w2), each either stored whole or as a product (w1_a @ w1_b,
//   w2_a @ w2_b, or with "t2" a CP product);
// reshaped to W's shape. Any kind may carry a DoRA magnitude "dora_scale" (LyCORIS's
// weight decomposition; the multiplier as ComfyUI applies it): the merged W + scale() * D
// is rescaled so that its norm along one axis becomes dora_scale, W' = W + m * (that - W);
// see dora_axis.
enum class LoraKind { lora, loha, lokr };

struct LoraModule {
    std::string key;    // the module's name in the file, e.g. "lora_unet_down_blocks_0_..._to_q"
    std::string stage;  // "unet", "text_encoder" or (SDXL) "text_encoder_2"
    std::string param;  // the parameter in that stage's weight file, e.g. "input_blocks.1.1....to_q.weight"
    LoraKind kind = LoraKind::lora;
    // The module's tensors (byte ranges in the file) by their part of the key:
    // "down", "up", "mid"; "hada_w1_a" ... "hada_t2"; "lokr_w1", "lokr_w1_a" ... "lokr_t2";
    // and "dora_scale".
    std::map<std::string, WeightEntry> parts;
    // What alpha is divided by: lora's down's first size, loha's w1_b's, lokr's w2_b's
    // (else w1_b's); 0 for a LoKr module with neither, whose scale is 1.
    int64_t rank = 0;
    double alpha = 0;  // from the file (F16, BF16, F32 or F64); absent: rank (scale 1)
    double scale() const { return rank > 0 ? alpha / static_cast<double>(rank) : 1.0; }
    const WeightEntry& part(const std::string& name) const { return parts.at(name); }
    bool has(const std::string& name) const { return parts.count(name) > 0; }
};

struct LoraFile {
    std::string path;
    std::string format;  // "kohya" or "diffusers"
    std::vector<LoraModule> modules;
    // read_lora: the file, open once for its header, hash and (lora_merge.h) tensors.
    std::shared_ptr<TensorReader> file;
    std::string hash;  // A1111's short hash (lora_short_hash), from that same read
};

// The parameters a LoRA may change: the headers of the model's unet.weights and
// text_encoder.weights, and for SDXL text_encoder_2.weights (non-empty only there:
// it is what makes the names SDXL's, lora_te1_ / lora_te2_ instead of lora_te_).
struct LoraTargets {
    std::vector<WeightEntry> unet, text_encoder, text_encoder_2;
};

// Opens a LoRA file once, reads its header, alpha scalars and hash, and maps
// every module to its target. Throws sd::Error with one line naming the file for a corrupt
// file, an unknown layout, keys that match no layer of the model (the first
// few and their count) and modules whose shapes do not fit their target.
LoraFile read_lora(const std::string& path, const LoraTargets& targets);

// The same on a whole file in memory (the fuzz harness and the unit tests).
LoraFile parse_lora(const std::string& file_bytes, const std::string& path, const LoraTargets& targets);

// A LoHa's second product (w2_a @ w2_b) is multiplied into the first this many bytes
// of rows at a time (lora_merge.cpp), so only one of its whole-size factors is held.
constexpr int64_t kLohaRowChunkBytes = 1 << 20;

// What merging costs one stage in memory (docs/memory.md): every parameter a
// LoRA changes gets a new fp32 tensor (touched), and the largest change is
// computed beside its copy (largest: twice its size for a LoHa whose second
// factor is a CP product, plus a row chunk for the other LoHas); bytes.
struct LoraFootprint {
    double touched = 0, largest = 0;
    double largest_param = 0;  // the largest changed parameter's fp32 bytes
    double total() const { return touched + largest; }
};
LoraFootprint lora_footprint(const std::vector<const LoraFile*>& files, const std::vector<WeightEntry>& stage_index,
                             const std::string& stage);

// A DoRA magnitude's axis for a weight of shape w: 0 when dora_scale has w's dims and
// is [out, 1, ...] (one magnitude per output row, LyCORIS's wd_on_out), 1 when it is
// [1, in, 1, ...] (per input column, LyCORIS's first form and A1111's); -1 for any
// other shape. dora_shape gives the shape an axis needs.
int dora_axis(const std::vector<int64_t>& scale, const std::vector<int64_t>& w);
std::vector<int64_t> dora_shape(const std::vector<int64_t>& w, int axis);

// The diffusers module path of one CompVis UNet module ("input_blocks.1.0.in_layers.2"
// -> "down_blocks.0.resnets.0.conv1"), for UNets with two ResBlocks a down level and
// three an up level (SD 1.x, 2.x and SDXL, whose levels are fewer but built alike,
// diffusers' _maybe_map_sgm_blocks_to_diffusers); "" when it has none.
std::string diffusers_unet_module(const std::string& compvis);

// The first 12 hex digits of SHA-256 over the tensor data of a .safetensors
// file (everything after its header): the "Lora hashes" of AUTOMATIC1111's
// PNG text. Throws sd::Error when the file cannot be read (one line naming it:
// missing, a folder or special file, a corrupt header).
std::string lora_short_hash(const std::string& path);
std::string lora_short_hash_of(const std::string& data_sha256_hex);  // the same from the data's SHA-256

}  // namespace sd
