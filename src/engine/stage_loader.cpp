#include "engine/stage_loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include "engine/blocked_operators.h"
#include "engine/operators.h"
#include "io/code_check.h"
#include "io/fs_util.h"
#include "io/weight_file.h"
#include "kernels/blocked_kernel.h"
#include "kernels/linear_kernel.h"
#include "kernels/winograd_bf16.h"
#include "sd/error.h"

namespace sd {

namespace {

// One read-only file mapped privately (a stray write copies a page; it never
// reaches the file). Unmapped when the last tensor that points into it dies.
struct Mapping {
    void* base = MAP_FAILED;
    size_t size = 0;
    ~Mapping() {
        if (base != MAP_FAILED) munmap(base, size);
    }
};

std::shared_ptr<Mapping> map_file(const std::string& path) {
    check_regular_file(path, "weights file");
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error("cannot read weights file " + path);
    struct stat st {};
    auto m = std::make_shared<Mapping>();
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
        m->size = static_cast<size_t>(st.st_size);
        m->base = mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    }
    close(fd);
    if (m->base == MAP_FAILED) throw Error("cannot map weights file " + path);
    return m;
}

at::ScalarType dtype_of(const std::string& name) {
    return name == "F32" ? at::kFloat : name == "F16" ? at::kHalf : name == "I8" ? at::kChar : at::kBFloat16;
}

// An 8-bit layer's scales (`L.weight_scale`, F16 beside an I8 `L.weight`; read_weight_index
// checked the pair): they go to the layer's weight_scale attribute, not to a parameter.
bool is_scale_entry(const WeightEntry& w) {
    const std::string tail = ".weight_scale";
    return w.dtype == "F16" && w.name.size() > tail.size() &&
           w.name.compare(w.name.size() - tail.size(), tail.size(), tail) == 0;
}

using ShapeMap = std::unordered_map<std::string, std::vector<int64_t>>;

// The archive entry where the export records each parameter's shape: the code
// file keeps only empty placeholders, so without it a weight file of another
// model with the same parameter names would load and fail mid-run.
constexpr const char* kShapesEntry = "parameter_shapes.json";

std::string lowercase(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

Error refused_code(const std::string& pt_path, const std::string& what) {
    return Error("model file " + pt_path + " uses an operation this tool's export never emits (" + what +
                 "); refusing to run it (see README \"Security\")");
}

// Loading a .pt runs its code (a scripted __setstate__ runs inside torch::jit::load), so
// its code/ records are read first and every operation they name must be one this tool's
// export emits (src/io/code_check.h). LibTorch finds records whatever their case, so every
// record that could be code is read, and names that differ only in case are refused.
void check_archive_code(caffe2::serialize::PyTorchStreamReader& reader, const std::string& pt_path) {
    std::unordered_set<std::string> seen;
    for (const auto& name : reader.getAllRecords()) {
        const std::string lower = lowercase(name);
        if (!seen.insert(lower).second) throw refused_code(pt_path, "two records named " + name);
        const bool code = lower.rfind("code/", 0) == 0 &&
                          !(lower.size() >= 10 && lower.compare(lower.size() - 10, 10, ".debug_pkl") == 0);
        // Unpickling the module can also build LibTorch's custom C++ classes by name.
        const bool pickle = lower == "data.pkl" || lower == "constants.pkl";
        if (!code && !pickle) continue;
        auto [data, size] = reader.getRecord(name);
        const std::string_view text(static_cast<const char*>(data.get()), size);
        if (code) {
            const std::string bad = unlisted_code_name(text);
            if (!bad.empty()) throw refused_code(pt_path, bad);
        } else if (text.find("torch.classes") != std::string_view::npos) {
            throw refused_code(pt_path, "__torch__.torch.classes in " + name);
        }
    }
}

// The shapes a .pt records, read from its archive without loading the module (none
// for an export older than the record), after checking the archive's code.
ShapeMap shapes_in_archive(const std::string& pt_path) {
    caffe2::serialize::PyTorchStreamReader reader(pt_path);
    check_archive_code(reader, pt_path);
    const std::string entry = std::string("extra/") + kShapesEntry;
    if (!reader.hasRecord(entry)) return {};
    auto [data, size] = reader.getRecord(entry);
    ShapeMap shapes;
    try {
        const auto j =
            nlohmann::json::parse(static_cast<const char*>(data.get()), static_cast<const char*>(data.get()) + size);
        for (const auto& [name, dims] : j.items()) shapes[name] = dims.get<std::vector<int64_t>>();
    } catch (const nlohmann::json::exception&) {
        throw Error("model file " + pt_path + " has a damaged " + kShapesEntry);
    }
    return shapes;
}

// A weight file fits its code when it holds exactly the recorded parameters,
// each in the recorded shape.
void check_fit(const std::vector<WeightEntry>& index, const ShapeMap& shapes, const std::string& path,
               const std::string& pt_path) {
    std::unordered_map<std::string, const WeightEntry*> by_name;
    size_t scales = 0;
    for (const auto& w : index) {
        if (is_scale_entry(w))
            ++scales;
        else
            by_name[w.name] = &w;
    }
    for (const auto& [name, want] : shapes) {
        auto it = by_name.find(name);
        if (it == by_name.end()) throw Error("weights file " + path + " lacks the parameter " + name);
        if (it->second->shape != want)
            throw Error("weights file " + path + " does not fit " + pt_path + ": " + name + " is " +
                        shape_text(it->second->shape) + " there, the model expects " + shape_text(want) +
                        " (files of two different exports?)");
    }
    if (by_name.size() != shapes.size() || by_name.size() + scales != index.size())
        throw Error("weights file " + path + " holds tensors its model file does not have");
}

// The layer `L` of `L.weight_scale`, when m has one that can expand 8-bit weights.
std::optional<torch::jit::Module> scaled_layer(torch::jit::Module& m, const std::string& scale_name) {
    const std::string path = scale_name.substr(0, scale_name.size() - std::string(".weight_scale").size());
    torch::jit::Module sub = m;
    size_t from = 0;
    while (from <= path.size()) {
        const size_t dot = std::min(path.find('.', from), path.size());
        const std::string part = path.substr(from, dot - from);
        if (!sub.hasattr(part) || !sub.attr(part).isModule()) return std::nullopt;
        sub = sub.attr(part).toModule();
        from = dot + 1;
    }
    if (!sub.hasattr("weight_scale") || !sub.hasattr("weight")) return std::nullopt;
    return sub;
}

// Points every parameter of m at its bytes in the weight file. A tensor that
// is converted or moved away hands its pages back at once (MADV_DONTNEED), so
// widening an fp16 file never holds both copies of the weights.
void map_weights(torch::jit::Module& m, const std::string& path, const std::vector<WeightEntry>& index) {
    const auto mapping = map_file(path);
    std::unordered_map<std::string, const WeightEntry*> by_name;
    for (const auto& w : index) by_name[w.name] = &w;
    size_t used = 0;
    for (const auto& p : m.named_parameters(/*recurse=*/true)) {
        auto it = by_name.find(p.name);
        if (it == by_name.end()) throw Error("weights file " + path + " lacks the parameter " + p.name);
        const WeightEntry& w = *it->second;
        char* data = static_cast<char*>(mapping->base) + w.begin;
        auto release = [mapping, data, bytes = w.end - w.begin](void*) {
            const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
            const uintptr_t from = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
            const uintptr_t to = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
            if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
        };
        at::Tensor t = torch::from_blob(data, w.shape, release, at::TensorOptions().dtype(dtype_of(w.dtype)));
        at::Tensor target = p.value;
        target.set_data(t);
        ++used;
    }
    for (const auto& w : index) {
        if (!is_scale_entry(w)) continue;
        auto layer = scaled_layer(m, w.name);
        if (!layer)
            throw Error("weights file " + path + " holds 8-bit blocks for " + w.name.substr(0, w.name.size() - 6) +
                        ", a layer of its model file that cannot expand them (files of two different exports?)");
        char* data = static_cast<char*>(mapping->base) + w.begin;
        layer->setattr("weight_scale", torch::from_blob(
                                           data, w.shape, [mapping](void*) {}, at::TensorOptions().dtype(at::kHalf)));
        ++used;
    }
    if (used != index.size()) throw Error("weights file " + path + " holds tensors its model file does not have");
}

// The checks on a stage's files that need only their headers. Returns the
// weight file's index, or nothing for an old export that keeps its weights
// inside the .pt.
std::optional<std::vector<WeightEntry>> checked_weight_index(const std::string& path) {
    if (!file_exists(path)) throw Error("model file " + path + " is missing");
    check_regular_file(path, "model file");  // a FIFO or device would block or spin the archive reader
    ShapeMap shapes;
    try {
        shapes = shapes_in_archive(path);
    } catch (const Error&) {
        throw;
    } catch (const std::exception&) {
        throw Error("cannot load model file " + path + ": not a valid TorchScript file (corrupt or truncated?)");
    }
    const std::string weights_path = weight_file_for(path);
    if (!file_exists(weights_path)) {
        // Without the record, an old export with the weights inside the .pt is still fine.
        if (!shapes.empty())
            throw Error("model file " + path + " has its weights in " + weights_path + ", which is missing");
        return std::nullopt;
    }
    auto index = read_weight_index(weights_path);
    if (!shapes.empty()) check_fit(index, shapes, weights_path, path);
    return index;
}

// Points each named parameter at its replacement (before the dtype conversion
// below, which then applies to them too). Shapes were checked when read.
void replace_weights(torch::jit::Module& m, const std::map<std::string, at::Tensor>& replace) {
    for (const auto& p : m.named_parameters(/*recurse=*/true)) {
        const auto it = replace.find(p.name);
        if (it == replace.end()) continue;
        at::Tensor target = p.value;
        target.set_data(it->second);
    }
}

}  // namespace

std::string script_error_line(const std::string& what) {
    const size_t end = what.find_last_not_of(" \t\r\n");
    if (end == std::string::npos) return "unknown error";
    const size_t newline = what.find_last_of('\n', end);
    const size_t begin = newline == std::string::npos ? 0 : newline + 1;
    return what.substr(begin, end + 1 - begin);
}

std::string short_message(const c10::Error& e) {
    std::string m = e.what_without_backtrace();
    auto nl = m.find('\n');
    return nl == std::string::npos ? m : m.substr(0, nl);
}

void check_stage_files(const std::string& path) { checked_weight_index(path); }

torch::jit::Module load_stage(const std::string& path, at::ScalarType weights, c10::Device device,
                              const std::map<std::string, at::Tensor>* replace, const StageEdit& edit) {
    const auto index = checked_weight_index(path);
    register_operators();          // the modules' code names sd::attention and sd::linear
    register_blocked_operators();  // and sd_blocked::* (the ResNet blocks)
    try {
        auto m = torch::jit::load(path, torch::kCPU);
        m.eval();
        const std::string weights_path = weight_file_for(path);
        if (index) {
            map_weights(m, weights_path, *index);
        } else {
            for (const auto& p : m.parameters())
                if (p.numel() == 0)
                    throw Error("model file " + path + " has its weights in " + weights_path + ", which is missing");
        }
        if (replace) replace_weights(m, *replace);
        if (edit) edit(m);
        // Module::to replaces one tensor at a time, so converting costs at most
        // one extra tensor, not a second copy of the weights.
        for (const auto& p : m.parameters()) {
            if (p.is_floating_point() && p.scalar_type() != weights) {
                m.to(weights);
                break;
            }
        }
        if (!device.is_cpu()) m.to(device);
        return m;
    } catch (const Error&) {
        throw;
    } catch (const c10::Error& e) {
        throw Error("cannot load model file " + path + ": not a valid TorchScript file (corrupt or truncated?)");
    } catch (const std::exception& e) {
        throw Error("cannot load model file " + path + ": " + e.what());
    }
}

void set_attention(torch::jit::Module& m, const AttentionSetting& a) {
    for (auto sub : m.modules()) {
        if (sub.hasattr("attention_mode")) {
            sub.setattr("attention_mode", static_cast<int64_t>(a.mode));
            sub.setattr("attention_chunk", static_cast<int64_t>(a.chunk));
        }
    }
}

namespace {

std::vector<int64_t> int_list(const c10::IValue& v) {
    std::vector<int64_t> out;
    if (v.isTuple())
        for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toInt());
    else if (v.isIntList())
        out = v.toIntVector();
    return out;
}

}  // namespace

namespace {

// Whether sd::conv3x3 will take this bf16 layer by Winograd at the latent size given: the
// UNet's layers run at latent / latent_div, the VAE's at latent x latent_mul (exports made
// before the VAE's took the route have no latent_mul).
bool runs_bf16_winograd(const torch::jit::Module& conv, const at::Tensor& w, int64_t latent_h, int64_t latent_w) {
    if (latent_h <= 0 || latent_w <= 0 || w.scalar_type() != at::kBFloat16 || !conv.hasattr("unit_3x3") ||
        !conv.hasattr("latent_div") || !conv.attr("unit_3x3").toBool() || !bf16_winograd_enabled())
        return false;
    const int64_t div = conv.attr("latent_div").toInt();
    const int64_t mul = conv.hasattr("latent_mul") ? conv.attr("latent_mul").toInt() : 0;
    if (div > 0) return kernels::winograd_bf16_runs(1, w.size(1), w.size(0), latent_h / div, latent_w / div);
    return mul > 0 && kernels::winograd_bf16_runs(1, w.size(1), w.size(0), latent_h * mul, latent_w * mul);
}

}  // namespace

int prepack_convolutions(torch::jit::Module& m, int64_t latent_h, int64_t latent_w) {
    int packed = 0;
    for (auto sub : m.modules()) {
        // conv_split marks this tool's Conv2d, whose forward takes a packed weight.
        if (!sub.hasattr("conv_split") || !sub.hasattr("weight")) continue;
        const auto type = sub.type();
        if (!type->hasConstant("padding") || !type->hasConstant("stride") || !type->hasConstant("dilation") ||
            !type->hasConstant("groups"))
            continue;
        const at::Tensor w = sub.attr("weight").toTensor();
        // 1x1 convolutions ran slower packed (their activations' reorder costs
        // more than the weight's); 4-channel ones (conv_in, conv_out) would be padded.
        // bf16 weights (--precision bf16) only where oneDNN has bf16 instructions to run them.
        const bool type_ok =
            w.scalar_type() == at::kFloat || (w.scalar_type() == at::kBFloat16 && kernels::cpu_has_bf16());
        if (w.dim() != 4 || w.is_mkldnn() || !w.device().is_cpu() || !type_ok || w.size(2) * w.size(3) == 1 ||
            w.size(0) % 16 != 0 || w.size(1) % 16 != 0)
            continue;
        const auto padding = int_list(type->getConstant("padding"));
        const auto stride = int_list(type->getConstant("stride"));
        const auto dilation = int_list(type->getConstant("dilation"));
        const int64_t groups = type->getConstant("groups").toInt();
        if (padding.size() != 2 || stride.size() != 2 || dilation.size() != 2) continue;
        if (runs_bf16_winograd(sub, w, latent_h, latent_w)) continue;
        at::Tensor p = at::mkldnn_reorder_conv2d_weight(w.to_mkldnn(), padding, stride, dilation, groups);
        sub.register_parameter("weight", p, /*is_buffer=*/false);  // the dense tensor's last use: its pages go
        ++packed;
    }
    return packed;
}

int prepack_blocked(torch::jit::Module& m, const WinogradChoice& winograd, int* winograd_layers) {
    const int block = blocked_route_block();
    if (block == 0) return 0;
    int switched = 0;
    for (auto sub : m.modules()) {
        // `blocked` marks the modules that can run as one sd_blocked operator.
        if (!sub.hasattr("blocked") || sub.attr("blocked").toInt() != 0) continue;
        std::vector<torch::jit::Module> convs;
        bool fits = true;
        for (auto inner : sub.modules()) {
            if (!inner.hasattr("conv_split") || !inner.hasattr("weight")) continue;
            const at::Tensor w = inner.attr("weight").toTensor();
            // fp32 only; fewer channels than a block (4-channel latents) make oneDNN
            // fall back to its reference convolution.
            fits = fits && w.dim() == 4 && !w.is_mkldnn() && w.device().is_cpu() && w.scalar_type() == at::kFloat &&
                   w.size(0) >= block && w.size(1) >= block;
            convs.push_back(inner);
        }
        if (!fits || convs.empty()) continue;
        for (auto& conv : convs) {
            const at::Tensor w = conv.attr("weight").toTensor();
            const auto type = conv.type();
            const bool unit_stride =
                type->hasConstant("stride") && int_list(type->getConstant("stride")) == std::vector<int64_t>{1, 1};
            WinogradSize size;
            for (const auto& [channels, at] : winograd.levels)
                if (unit_stride && w.size(2) == 3 && w.size(3) == 3 && w.size(0) == channels) size = at;
            size.per_call = winograd.per_call && unit_stride && w.size(2) == 3 && w.size(3) == 3;
            const at::Tensor packed = pack_conv_weight(w, block, size);
            if (winograd_layers && has_winograd_form(packed, w.size(0), w.size(1), w.size(2), block))
                ++*winograd_layers;
            conv.register_parameter("weight", packed, /*is_buffer=*/false);
        }
        sub.setattr("blocked", static_cast<int64_t>(block));
        ++switched;
    }
    return switched;
}

int use_fused_rows(torch::jit::Module& m) {
    int switched = 0;
    for (auto sub : m.modules()) {
        if (!sub.hasattr("fused_rows")) continue;
        sub.setattr("fused_rows", static_cast<int64_t>(1));
        ++switched;
    }
    return switched;
}

void set_layer_memory(torch::jit::Module& m, int ff_chunk, int64_t conv_split) {
    for (auto sub : m.modules()) {
        if (sub.hasattr("ff_chunk")) sub.setattr("ff_chunk", static_cast<int64_t>(ff_chunk));
        if (sub.hasattr("conv_split")) sub.setattr("conv_split", conv_split);
    }
}

}  // namespace sd
