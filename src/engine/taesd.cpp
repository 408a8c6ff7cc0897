#include "engine/taesd.h"

#include <vector>

#include "engine/addon_weights.h"
#include "engine/blocked_operators.h"
#include "io/fs_util.h"
#include "io/printable.h"
#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

namespace {

// madebyollin's Decoder() as an nn.Sequential, by index: 0 clamp, 1 conv
// 4->C, 2 ReLU, then blocks, upsamples (x2 nearest) and bias-free convs, and
// 19 the conv C->3. Only the layers with weights are listed.
enum class Kind { conv, conv_no_bias, block };
struct Layer {
    int index;
    Kind kind;
};
constexpr Layer kLayers[] = {
    {1, Kind::conv},   {3, Kind::block},  {4, Kind::block},         {5, Kind::block},         {7, Kind::conv_no_bias},
    {8, Kind::block},  {9, Kind::block},  {10, Kind::block},        {12, Kind::conv_no_bias}, {13, Kind::block},
    {14, Kind::block}, {15, Kind::block}, {17, Kind::conv_no_bias}, {18, Kind::block},        {19, Kind::conv},
};
constexpr int kLatentChannels = 4;
// A TAESD decoder is ~1.2 M parameters (5 MB in fp32); a file whose tensors
// need more is not one, and is refused before its memory is taken.
constexpr uint64_t kMaxTaesdBytes = 256u << 20;

// Every tensor the decoder needs, by madebyollin's name, for C channels.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(int64_t c) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> out;
    for (const auto& l : kLayers) {
        const std::string p = std::to_string(l.index);
        if (l.kind == Kind::block) {
            for (const char* i : {"0", "2", "4"}) {
                out.push_back({p + ".conv." + i + ".weight", {c, c, 3, 3}});
                out.push_back({p + ".conv." + i + ".bias", {c}});
            }
            continue;
        }
        const int64_t in = l.index == 1 ? kLatentChannels : c, outc = l.index == 19 ? 3 : c;
        out.push_back({p + ".weight", {outc, in, 3, 3}});
        if (l.kind == Kind::conv) out.push_back({p + ".bias", {outc}});
    }
    return out;
}

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

// diffusers' "decoder.layers.{i}.rest" is madebyollin's "{i+1}.rest" (diffusers
// applies the clamp in forward(), not as layer 0). Encoder tensors are left out;
// anything else keeps its name and is refused below as unexpected.
std::string madebyollin_name(const std::string& name) {
    const std::string head = "decoder.layers.";
    if (!starts_with(name, head)) return name;
    const size_t dot = name.find('.', head.size());
    const std::string num = name.substr(head.size(), dot == std::string::npos ? std::string::npos : dot - head.size());
    if (num.empty() || num.size() > 3 || num.find_first_not_of("0123456789") != std::string::npos) return name;
    return std::to_string(std::stoi(num) + 1) + (dot == std::string::npos ? "" : name.substr(dot));
}

bool is_encoder(const std::string& name) { return starts_with(name, "encoder."); }

// The weights file of a path: the file itself, or a diffusers folder's.
std::string weights_file_of(const std::string& path) {
    if (!is_directory(path)) return path;
    const std::string file = join_path(path, "diffusion_pytorch_model.safetensors");
    if (!file_exists(file))
        throw Error("TAESD folder " + path +
                    " has no diffusion_pytorch_model.safetensors (a diffusers AutoencoderTiny "
                    "folder, or give the taesd_decoder.pth / .safetensors file itself)");
    return file;
}

}  // namespace

std::string taesd_path_of(const std::string& spec, const std::string& flag) {
    const std::string head = "taesd:";
    if (!starts_with(spec, head))
        throw Error(flag + " takes taesd:FILE (a TAESD decoder file or AutoencoderTiny folder), not '" + spec + "'");
    if (spec.size() == head.size()) throw Error(flag + " taesd: needs a path after 'taesd:'");
    return spec.substr(head.size());
}

TaesdDecoder TaesdDecoder::load(const std::string& path) {
    if (!is_directory(path)) check_regular_file(path, "TAESD decoder");  // a FIFO would block the read
    const std::string file = weights_file_of(path);
    TaesdDecoder d;
    for (auto& [name, t] :
         read_addon_weights(file, "TAESD decoder", kMaxTaesdBytes, [](const std::string& n) { return !is_encoder(n); }))
        d.weights_[madebyollin_name(name)] = t.contiguous();
    const auto first = d.weights_.find("1.weight");
    if (first == d.weights_.end())
        throw Error("TAESD decoder " + file +
                    " lacks the tensor 1.weight (decoder.layers.0.weight): not a TAESD decoder");
    if (const std::string p = float_dtype_problem(first->second); !p.empty())
        throw Error("TAESD decoder " + file + ": 1.weight " + p);
    if (first->second.dim() != 4 || first->second.size(0) < 1)
        throw Error("TAESD decoder " + file + ": 1.weight is " + shape_text(first->second.sizes().vec()) +
                    ", a TAESD decoder's is [C,4,3,3]");
    d.channels_ = static_cast<int>(first->second.size(0));
    const auto expected = expected_tensors(d.channels_);
    for (const auto& [name, shape] : expected) {
        const auto it = d.weights_.find(name);
        if (it == d.weights_.end()) throw Error("TAESD decoder " + file + " lacks the tensor " + name);
        if (const std::string p = float_dtype_problem(it->second); !p.empty())
            throw Error("TAESD decoder " + file + ": " + name + " " + p);
        if (it->second.sizes() != at::IntArrayRef(shape))
            throw Error("TAESD decoder " + file + ": " + name + " is " + shape_text(it->second.sizes().vec()) +
                        ", expected " + shape_text(shape) + " for " + std::to_string(d.channels_) + " channels");
    }
    if (d.weights_.size() != expected.size()) {
        for (const auto& [name, t] : d.weights_) {
            bool known = false;
            for (const auto& e : expected) known = known || e.first == name;
            if (!known)
                throw Error("TAESD decoder " + file + " holds an unexpected tensor " + printable(name) +
                            ": not a TAESD decoder");
        }
    }
    for (auto& [name, t] : d.weights_)
        if (!at::isfinite(t).all().item<bool>())
            throw Error("TAESD decoder " + file + ": " + name + " holds NaN or Inf");
    return d;
}

// bf16 runs channels-last: oneDNN's bf16 convolutions then take the activations as they are,
// with no reorder in and out of each layer (512x512: 0.37 s -> 0.15 s). fp32 stays
// as it was, its pictures byte-stable.
void TaesdDecoder::to(c10::Device device, at::ScalarType dtype) {
    channels_last_ = device.is_cpu() && dtype == at::kBFloat16;
    for (auto& [name, t] : weights_) {
        t = t.to(device, dtype);
        if (channels_last_ && t.dim() == 4) t = t.contiguous(at::MemoryFormat::ChannelsLast);
    }
}

double TaesdDecoder::weight_bytes() const {
    double n = 0;
    for (const auto& [name, t] : weights_) n += static_cast<double>(t.numel()) * t.element_size();
    return n;
}

// Block(x) = ReLU(conv(ReLU(conv(ReLU(conv(x))))) + x); C -> C, so no skip conv.
at::Tensor TaesdDecoder::block(const at::Tensor& x, int layer) const {
    const std::string p = std::to_string(layer) + ".conv.";
    auto h = at::relu(at::conv2d(x, w(p + "0.weight"), w(p + "0.bias"), 1, 1));
    h = at::relu(at::conv2d(h, w(p + "2.weight"), w(p + "2.bias"), 1, 1));
    h = at::conv2d(h, w(p + "4.weight"), w(p + "4.bias"), 1, 1);
    return at::relu(h + x);
}

// The same layers with the C-channel activations blocked and each 3x3 weight in its
// Winograd form for the size it runs at (made per call: a few milliseconds for TAESD's
// small weights). fp32 at 512x512 on 2 cores: 0.58-0.65 s -> 0.40-0.49 s (docs/benchmarks.md).
at::Tensor TaesdDecoder::decode_blocked(const at::Tensor& latents) const {
    const int64_t B = blocked_route_block();
    const int64_t c = channels_, n = latents.size(0);
    auto packed = [&](const std::string& key, int64_t h, int64_t w) {
        return pack_conv_weight(this->w(key), B, WinogradSize{n, h, w});
    };
    at::Tensor x = at::tanh(latents / 3.0) * 3.0;
    x = at::relu(at::conv2d(x, w("1.weight"), w("1.bias"), 1, 1));  // 4 -> C: too few channels to block
    at::Tensor xb = plain_to_blocked(x, B);
    for (const auto& l : kLayers) {
        const std::string p = std::to_string(l.index);
        const int64_t h = xb.size(2), wd = xb.size(3);
        if (l.kind == Kind::block) {
            const std::string q = p + ".conv.";
            auto t = blocked_conv3x3(xb, packed(q + "0.weight", h, wd), w(q + "0.bias"), c, c, B).relu_();
            t = blocked_conv3x3(t, packed(q + "2.weight", h, wd), w(q + "2.bias"), c, c, B).relu_();
            // The residual rides on the third convolution: x += conv(t), in place.
            xb = blocked_conv3x3(t, packed(q + "4.weight", h, wd), w(q + "4.bias"), c, c, B, xb).relu_();
        } else if (l.kind == Kind::conv_no_bias) {
            xb = blocked_upsample(xb, packed(p + ".weight", 2 * h, 2 * wd), c10::nullopt, c, B, false);
        }
    }
    return at::conv2d(blocked_to_plain(xb), w("19.weight"), w("19.bias"), 1, 1).contiguous();  // C -> 3
}

at::Tensor TaesdDecoder::decode(const at::Tensor& latents, bool winograd) const {
    if (winograd && !channels_last_ && latents.device().is_cpu() && latents.scalar_type() == at::kFloat &&
        winograd_available() && channels_ % blocked_route_block() == 0)
        return decode_blocked(latents);
    at::Tensor x = at::tanh(latents / 3.0) * 3.0;  // layer 0: the clamp
    if (channels_last_) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    for (const auto& l : kLayers) {
        const std::string p = std::to_string(l.index);
        switch (l.kind) {
            case Kind::conv:
                x = at::conv2d(x, w(p + ".weight"), w(p + ".bias"), 1, 1);
                if (l.index == 1) x = at::relu(x);  // layer 2
                break;
            case Kind::conv_no_bias:  // preceded by Upsample(x2, nearest)
                x = at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2});
                x = at::conv2d(x, w(p + ".weight"), {}, 1, 1);
                break;
            case Kind::block:
                x = block(x, l.index);
                break;
        }
    }
    return x.contiguous();
}

}  // namespace sd
