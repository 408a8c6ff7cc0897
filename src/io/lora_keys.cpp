#include "io/lora_keys.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "io/fs_util.h"
#include "io/printable.h"
#include "io/sha256.h"
#include "io/tensor_reader.h"
#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (c == sep) {
            out.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    out.push_back(cur);
    return out;
}

std::string join(const std::vector<std::string>& parts, size_t from, size_t to) {
    std::string out;
    for (size_t i = from; i < to && i < parts.size(); ++i) out += (out.empty() ? "" : ".") + parts[i];
    return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::optional<int> small_number(const std::string& s) {
    if (s.empty() || s.size() > 4 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    return std::stoi(s);
}

// A ResBlock's CompVis layer names in diffusers' ResnetBlock2D.
std::string resnet_part(const std::string& rest) {
    static const std::map<std::string, std::string> names = {
        {"in_layers.0", "norm1"},  {"in_layers.2", "conv1"},          {"out_layers.0", "norm2"},
        {"out_layers.3", "conv2"}, {"emb_layers.1", "time_emb_proj"}, {"skip_connection", "conv_shortcut"}};
    const auto it = names.find(rest);
    return it == names.end() ? "" : it->second;
}

// "X.resnets.j.<part>" or "X.attentions.j.<rest>" for layer K of a CompVis block.
std::string block_part(const std::string& base, int j, int k, const std::vector<std::string>& t, size_t rest_at) {
    const std::string rest = join(t, rest_at, t.size());
    if (k == 0) {
        const std::string part = resnet_part(rest);
        return part.empty() ? "" : base + ".resnets." + std::to_string(j) + "." + part;
    }
    return rest.empty() ? "" : base + ".attentions." + std::to_string(j) + "." + rest;
}

}  // namespace

// SD 1.x / 2.x UNets: two ResBlocks (and attentions) per down level, three per up
// level, a down- or upsampler closing every level but the last (CompVis
// openaimodel.py's block order, which diffusers' convert_ldm_unet_checkpoint follows).
std::string diffusers_unet_module(const std::string& compvis) {
    static const std::map<std::string, std::string> top = {{"time_embed.0", "time_embedding.linear_1"},
                                                           {"time_embed.2", "time_embedding.linear_2"},
                                                           {"input_blocks.0.0", "conv_in"},
                                                           {"out.0", "conv_norm_out"},
                                                           {"out.2", "conv_out"}};
    if (auto it = top.find(compvis); it != top.end()) return it->second;
    const auto t = split(compvis, '.');
    if (t.size() < 3) return "";
    const auto n = small_number(t[1]);
    if (!n) return "";
    if (t[0] == "middle_block") {  // ResBlock, attention, ResBlock
        const std::string rest = join(t, 2, t.size());
        if (*n == 1) return "mid_block.attentions.0." + rest;
        const std::string part = resnet_part(rest);
        return (*n == 0 || *n == 2) && !part.empty() ? "mid_block.resnets." + std::to_string(*n / 2) + "." + part : "";
    }
    const auto k = small_number(t[2]);
    if (!k) return "";
    if (t[0] == "input_blocks" && *n >= 1) {
        const int level = (*n - 1) / 3, j = (*n - 1) % 3;
        const std::string base = "down_blocks." + std::to_string(level);
        if (j == 2) return *k == 0 && t.size() == 4 && t[3] == "op" ? base + ".downsamplers.0.conv" : "";
        return *k <= 1 ? block_part(base, j, *k, t, 3) : "";
    }
    if (t[0] == "output_blocks") {
        const int level = *n / 3, j = *n % 3;
        const std::string base = "up_blocks." + std::to_string(level);
        // The upsampler follows the ResBlock, or the ResBlock and its attention.
        if (j == 2 && *k >= 1 && t.size() == 4 && t[3] == "conv") return base + ".upsamplers.0.conv";
        return *k <= 1 ? block_part(base, j, *k, t, 3) : "";
    }
    return "";
}

namespace {

Error lora_error(const std::string& path, const std::string& what) { return Error("LoRA file " + path + " " + what); }

// A key of the file, safe in a one-line message.
std::string key(const std::string& k) { return printable(k); }

std::string underscored(std::string s) {
    for (auto& c : s)
        if (c == '.') c = '_';
    return s;
}

struct Target {
    std::string stage;
    const WeightEntry* weight = nullptr;
};

// Every name a LoRA may give a target module -> that module's weight.
using TargetTable = std::unordered_map<std::string, Target>;

std::string module_of(const std::string& param) { return param.substr(0, param.size() - 7); }  // less ".weight"

TargetTable target_table(const LoraTargets& targets) {
    TargetTable table;
    for (const auto& w : targets.unet) {
        if (!ends_with(w.name, ".weight")) continue;
        const std::string compvis = module_of(w.name);
        const Target t{"unet", &w};
        // kohya files written with CompVis block names (some trainers do).
        table.emplace("lora_unet_" + underscored(compvis), t);
        const std::string diffusers = diffusers_unet_module(compvis);
        if (diffusers.empty()) continue;
        table.emplace("lora_unet_" + underscored(diffusers), t);
        table.emplace("unet." + diffusers, t);
    }
    // SDXL (two text encoders, HF names in both exports): kohya's lora_te1_ / lora_te2_,
    // diffusers' text_encoder. / text_encoder_2.; SD 1.x and 2.x: lora_te_ / text_encoder.
    const bool sdxl = !targets.text_encoder_2.empty();
    for (auto [stage, index, kohya] :
         {std::tuple{"text_encoder", &targets.text_encoder, sdxl ? "lora_te1_" : "lora_te_"},
          std::tuple{"text_encoder_2", &targets.text_encoder_2, "lora_te2_"}}) {
        for (const auto& w : *index) {
            if (!ends_with(w.name, ".weight")) continue;
            const std::string m = module_of(w.name);
            const Target t{stage, &w};
            table.emplace(kohya + underscored(m), t);
            table.emplace(std::string(stage) + "." + m, t);
        }
    }
    return table;
}

// The transformer layers a text-encoder index holds (text_model.encoder.layers.N.*).
int built_layers(const std::vector<WeightEntry>& index) {
    int n = 0;
    const std::string prefix = "text_model.encoder.layers.";
    for (const auto& w : index) {
        if (!starts_with(w.name, prefix)) continue;
        const auto k = small_number(w.name.substr(prefix.size(), w.name.find('.', prefix.size()) - prefix.size()));
        if (k) n = std::max(n, *k + 1);
    }
    return n;
}

// SD 2.x's and SDXL's first text encoder are exported without their last layer,
// whose output no picture uses (their conditioning is the penultimate state): a
// LoRA module of such a layer changes nothing here. Its layer-0 twin, whose shape
// it must fit, when `name` is one (kohya "..._layers_N_..." or diffusers
// "...layers.N...."); nullopt otherwise.
std::optional<Target> unbuilt_layer(const std::string& name, const TargetTable& table, const LoraTargets& targets) {
    for (const char* marker : {"text_model_encoder_layers_", "text_model.encoder.layers."}) {
        const size_t at = name.find(marker);
        if (at == std::string::npos) continue;
        const size_t from = at + std::strlen(marker), to = name.find_first_not_of("0123456789", from);
        if (to == std::string::npos || to == from) return std::nullopt;
        const auto n = small_number(name.substr(from, to - from));
        const auto twin = table.find(name.substr(0, from) + "0" + name.substr(to));
        if (!n || twin == table.end()) return std::nullopt;
        const auto& index = twin->second.stage == "text_encoder" ? targets.text_encoder : targets.text_encoder_2;
        if (*n >= built_layers(index)) return twin->second;
        return std::nullopt;
    }
    return std::nullopt;
}

// What one key of the file is: a module's name and the part it holds ("down",
// "up", "mid", "alpha", "hada_w1_a", "lokr_w2", ...; "" for none of these).
struct KeyPart {
    std::string module, part;
};

KeyPart classify(const std::string& key) {
    static const std::vector<std::pair<std::string, std::string>> suffixes = [] {
        std::vector<std::pair<std::string, std::string>> s = {{".lora_down.weight", "down"},
                                                              {".lora_up.weight", "up"},
                                                              {".lora_mid.weight", "mid"},
                                                              {".lora.down.weight", "down"},
                                                              {".lora.up.weight", "up"},
                                                              {".lora_linear_layer.down.weight", "down"},
                                                              {".lora_linear_layer.up.weight", "up"},
                                                              {".alpha", "alpha"},
                                                              {".dora_scale", "dora_scale"}};
        // LyCORIS names its tensors by their part alone.
        for (const char* part : {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2", "lokr_w1",
                                 "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2"})
            s.emplace_back(std::string(".") + part, part);
        return s;
    }();
    for (const auto& [suffix, part] : suffixes)
        if (ends_with(key, suffix)) return {key.substr(0, key.size() - suffix.size()), part};
    return {key, ""};
}

// Older diffusers files name attention LoRAs by their processor: ".processor.to_q_lora".
std::string without_processor(const std::string& module) {
    static const std::vector<std::pair<std::string, std::string>> names = {{".processor.to_q_lora", ".to_q"},
                                                                           {".processor.to_k_lora", ".to_k"},
                                                                           {".processor.to_v_lora", ".to_v"},
                                                                           {".processor.to_out_lora", ".to_out.0"}};
    for (const auto& [from, to] : names)
        if (ends_with(module, from)) return module.substr(0, module.size() - from.size()) + to;
    return module;
}

// Layouts this tool recognises but cannot apply, named in one line.
void refuse_other_layouts(const std::vector<WeightEntry>& index, const std::string& path, bool sdxl) {
    for (const auto& w : index) {
        const std::string& k = w.name;
        if (!sdxl && (starts_with(k, "lora_te1_") || starts_with(k, "lora_te2_")))
            throw lora_error(path, "is a LoRA for SDXL (" + key(k) + "); this model is SD 1.x or 2.x");
        if (sdxl && starts_with(k, "lora_te_"))
            throw lora_error(path, "is a LoRA for SD 1.x or 2.x (" + key(k) + "); this model is SDXL");
        if (ends_with(k, ".lora_A.weight") || ends_with(k, ".lora_B.weight"))
            throw lora_error(path, "is in the PEFT format (" + key(k) +
                                       "), which is not supported; use a kohya or pre-PEFT diffusers file");
        // wd_for_diff: a newer LyCORIS DoRA that rescales the change alone, not the merged weight.
        for (const char* other :
             {".oft_blocks", ".oft_diag", ".on_input", ".w_norm", ".a1.weight", ".diff", ".wd_for_diff"})
            if (ends_with(k, other))
                throw lora_error(path, "is a LyCORIS file of a kind this tool does not apply (" + key(k) +
                                           "); LoRA, LoCon, LoHa and LoKr files are supported");
        if (starts_with(k, "lora_te_") && k.find("resblocks") != std::string::npos)
            throw lora_error(path, "has an open_clip text-encoder layout (" + key(k) +
                                       "), which this tool's exports do not use; a LoRA for another model?");
    }
}

using Parts = std::map<std::string, WeightEntry>;  // part name -> tensor (alpha included)

std::string list_keys(const std::vector<std::string>& keys) {
    std::string out;
    for (size_t i = 0; i < keys.size() && i < 3; ++i) out += (i ? ", " : "") + key(keys[i]);
    if (keys.size() > 3) out += ", ...";
    return out;
}

std::string kind_of(const std::vector<int64_t>& shape) {
    if (shape.size() == 2) return "a linear layer";
    if (shape.size() == 4) return std::to_string(shape[2]) + "x" + std::to_string(shape[3]) + " conv";
    return "a " + std::to_string(shape.size()) + "-d tensor";
}

// Which kind of module a set of parts makes, or nullopt with the reason it makes none.
std::optional<LoraKind> kind_of_parts(const Parts& p, std::string& why) {
    const auto has = [&](const char* n) { return p.count(n) > 0; };
    // alpha and a DoRA's dora_scale go with any kind.
    const auto shared = [](const std::string& name) { return name == "alpha" || name == "dora_scale"; };
    const auto only = [&](const std::string& prefix) {
        for (const auto& [name, w] : p)
            if (!shared(name) && !starts_with(name, prefix)) return false;
        return true;
    };
    if (std::all_of(p.begin(), p.end(), [&](const auto& e) { return shared(e.first); })) {
        why = has("dora_scale") ? " (dora_scale without a LoRA module)" : " (alpha alone)";
    } else if (only("hada_")) {
        if (has("hada_w1_a") && has("hada_w1_b") && has("hada_w2_a") && has("hada_w2_b")) return LoraKind::loha;
        why = " (an incomplete LoHa module: it needs hada_w1_a, hada_w1_b, hada_w2_a and hada_w2_b)";
    } else if (only("lokr_")) {
        const bool w1 = has("lokr_w1") != (has("lokr_w1_a") && has("lokr_w1_b"));
        const bool w2 = has("lokr_w2") != (has("lokr_w2_a") && has("lokr_w2_b"));
        const bool stray = (has("lokr_w1") && (has("lokr_w1_a") || has("lokr_w1_b"))) ||
                           (has("lokr_w2") && (has("lokr_w2_a") || has("lokr_w2_b"))) ||
                           (has("lokr_t2") && !(has("lokr_w2_a") && has("lokr_w2_b"))) ||
                           has("lokr_w1_a") != has("lokr_w1_b") || has("lokr_w2_a") != has("lokr_w2_b");
        if (w1 && w2 && !stray) return LoraKind::lokr;
        why =
            " (an incomplete LoKr module: it needs lokr_w1 or lokr_w1_a and lokr_w1_b, and lokr_w2 or lokr_w2_a "
            "and lokr_w2_b)";
    } else if (has("down") && has("up")) {
        for (const auto& [name, w] : p)
            if (name != "down" && name != "up" && name != "mid" && !shared(name)) {
                why = " (LoRA and LyCORIS parts mixed)";
                return std::nullopt;
            }
        return LoraKind::lora;
    } else {
        why = has("down")  ? " (no up)"
              : has("up")  ? " (no down)"
              : has("mid") ? " (a mid without down and up)"
                           : " (LoRA and LyCORIS parts mixed)";
    }
    return std::nullopt;
}

// Sizes from a file: a product that overflows is no size.
std::optional<int64_t> product(const std::vector<int64_t>& s, size_t from) {
    int64_t n = 1;
    for (size_t i = from; i < s.size(); ++i)
        if (s[i] < 0 || __builtin_mul_overflow(n, s[i], &n)) return std::nullopt;
    return n;
}
std::optional<int64_t> times(int64_t a, int64_t b) {
    int64_t n;
    if (__builtin_mul_overflow(a, b, &n)) return std::nullopt;
    return n;
}

// The shape a factor of a module rebuilds, before it is reshaped to W: a @ b.flatten(1)
// (a matrix), or with t [i, j, kh, kw] the CP product of a [i, out] and b [j, in]
// ([out, in, kh, kw]); nullopt when the sizes do not chain.
std::optional<std::vector<int64_t>> rebuilt(const WeightEntry& a, const WeightEntry& b, const WeightEntry* t) {
    const auto& A = a.shape;
    const auto& B = b.shape;
    if (t) {
        const auto& T = t->shape;
        if (T.size() != 4 || A.size() != 2 || B.size() != 2 || A[0] != T[0] || B[0] != T[1]) return std::nullopt;
        return std::vector<int64_t>{A[1], B[1], T[2], T[3]};
    }
    const auto cols = product(B, 1);
    if (A.size() != 2 || B.size() < 2 || A[1] != B[0] || !cols) return std::nullopt;
    return std::vector<int64_t>{A[0], *cols};
}

// Whether a rebuilt shape becomes W by a reshape: the same shape, or a matrix
// [W[0], the rest of W].
bool fills(const std::optional<std::vector<int64_t>>& r, const std::vector<int64_t>& w) {
    if (!r) return false;
    if (*r == w) return true;
    return r->size() == 2 && (*r)[0] == w[0] && product(w, 1) == (*r)[1];
}

// LoKr's product kron(w1, w2): [a*c, b*d] for a matrix w2, [a*c, b*d, kh, kw] for a conv one.
std::optional<std::vector<int64_t>> kron_shape(const std::optional<std::vector<int64_t>>& w1,
                                               const std::optional<std::vector<int64_t>>& w2) {
    if (!w1 || !w2 || w1->size() != 2 || (w2->size() != 2 && w2->size() != 4)) return std::nullopt;
    std::vector<int64_t> out = *w2;
    const auto rows = times((*w1)[0], (*w2)[0]), cols = times((*w1)[1], (*w2)[1]);
    if (!rows || !cols) return std::nullopt;
    out[0] = *rows;
    out[1] = *cols;
    return out;
}

std::string shapes_of(const LoraModule& m) {
    std::string out;
    for (const auto& [name, w] : m.parts) out += (out.empty() ? "" : ", ") + name + " " + shape_text(w.shape);
    return out;
}

// The product up.flatten(1) @ down.flatten(1) has W's size and layout: same
// kind of layer (linear or conv with down's kernel, 1x1 up), same widths.
void check_lora_fit(const LoraModule& m, const std::vector<int64_t>& w, const std::string& path) {
    const auto& d = m.part("down").shape;
    const auto& u = m.part("up").shape;
    const std::string where = "does not fit this model: " + key(m.key);
    const bool conv = w.size() == 4;
    // What this target needs at the file's rank.
    std::vector<int64_t> want_down = {m.rank, w[1]}, want_up = {w[0], m.rank};
    if (conv) {
        want_down.insert(want_down.end(), {w[2], w[3]});
        want_up.insert(want_up.end(), {1, 1});
    }
    if (d == want_down && u == want_up) return;
    std::string hint = " (a LoRA for another model or size?)";
    if (w.size() == 4 && d.size() == 2 && w[2] == 1)
        hint = " (a LoRA for another model, e.g. SD 2.x's linear proj_in on SD 1.x's 1x1 conv?)";
    throw lora_error(path, where + " is " + kind_of(d) + " there (down " + shape_text(d) + ", up " + shape_text(u) +
                               "); " + m.stage + " " + m.param + " is " + kind_of(w) + " " + shape_text(w) +
                               " here, which needs down " + shape_text(want_down) + " and up " + shape_text(want_up) +
                               hint);
}

// The change the module rebuilds (lora_merge.cpp) has W's size: for LoRA as
// check_lora_fit says (with a mid: down [r, in] or [r, in, 1, 1], up [out, r] or
// [out, r, 1, 1], mid [r, r, kh, kw]); for LoHa each factor; for LoKr the Kronecker
// product. Also sets the module's rank.
void check_fit(LoraModule& m, const std::vector<int64_t>& w, const std::string& path) {
    if (w.size() != 2 && w.size() != 4)
        throw lora_error(path, "does not fit this model: " + key(m.key) + " changes " + m.stage + " " + m.param +
                                   ", which is not a linear or conv layer");
    for (const auto& [name, e] : m.parts) {
        if (e.shape.size() < 2)
            throw lora_error(path, "has a tensor that is not a matrix: " + key(e.name) + " " + shape_text(e.shape));
        for (int64_t d : e.shape)
            if (d <= 0) throw lora_error(path, "has an empty LoRA module " + key(m.key));
    }
    if (m.has("dora_scale") && dora_axis(m.part("dora_scale").shape, w) < 0)
        throw lora_error(path, "does not fit this model: " + key(m.key) + " has a DoRA magnitude dora_scale " +
                                   shape_text(m.part("dora_scale").shape) + "; " + m.stage + " " + m.param + " is " +
                                   kind_of(w) + " " + shape_text(w) + " here, which needs one per output " +
                                   shape_text(dora_shape(w, 0)) + " or per input " + shape_text(dora_shape(w, 1)));
    const auto p = [&](const char* n) { return m.has(n) ? &m.part(n) : nullptr; };
    bool ok = false;
    std::string what;
    if (m.kind == LoraKind::lora) {
        m.rank = m.part("down").shape[0];
        if (!m.has("mid")) return check_lora_fit(m, w, path);
        const auto& d = m.part("down").shape;
        const auto& u = m.part("up").shape;
        const bool one_by_one = (d.size() == 2 || (d.size() == 4 && d[2] == 1 && d[3] == 1)) &&
                                (u.size() == 2 || (u.size() == 4 && u[2] == 1 && u[3] == 1));
        const auto& t = m.part("mid").shape;
        ok = one_by_one && t.size() == 4 && t[0] == u[1] && t[1] == d[0] &&
             std::vector<int64_t>{u[0], d[1], t[2], t[3]} == w;
        what = "a LoCon module with a CP middle";
    } else if (m.kind == LoraKind::loha) {
        m.rank = m.part("hada_w1_b").shape[0];
        ok = fills(rebuilt(m.part("hada_w1_a"), m.part("hada_w1_b"), p("hada_t1")), w) &&
             fills(rebuilt(m.part("hada_w2_a"), m.part("hada_w2_b"), p("hada_t2")), w);
        what = "a LoHa module";
    } else {
        m.rank = m.has("lokr_w2_b")   ? m.part("lokr_w2_b").shape[0]
                 : m.has("lokr_w1_b") ? m.part("lokr_w1_b").shape[0]
                                      : 0;
        const auto w1 = m.has("lokr_w1") ? std::optional(m.part("lokr_w1").shape)
                                         : rebuilt(m.part("lokr_w1_a"), m.part("lokr_w1_b"), nullptr);
        const auto w2 = m.has("lokr_w2") ? std::optional(m.part("lokr_w2").shape)
                                         : rebuilt(m.part("lokr_w2_a"), m.part("lokr_w2_b"), p("lokr_t2"));
        const auto k = kron_shape(w1, w2);
        ok = k && (k->size() == 4 ? *k == w : fills(k, w));
        what = "a LoKr module";
    }
    if (!ok)
        throw lora_error(path, "does not fit this model: " + key(m.key) + " is " + what + " (" + shapes_of(m) + "); " +
                                   m.stage + " " + m.param + " is " + kind_of(w) + " " + shape_text(w) +
                                   " here (a LoRA for another model or size?)");
}

using AlphaReader = std::function<double(const WeightEntry&)>;

LoraFile describe(const std::vector<WeightEntry>& index, const AlphaReader& alpha_of, const std::string& path,
                  const LoraTargets& targets) {
    if (index.empty()) throw lora_error(path, "holds no tensors");
    refuse_other_layouts(index, path, !targets.text_encoder_2.empty());
    std::map<std::string, Parts> modules;  // sorted: a stable module order
    std::vector<std::string> unknown;
    for (const auto& w : index) {
        const KeyPart k = classify(w.name);
        if (k.part.empty()) {
            unknown.push_back(w.name);
            continue;
        }
        // An alpha is one number; F64 ones (some trainers write them) are read as such.
        const bool float_type =
            w.dtype == "F32" || w.dtype == "F16" || w.dtype == "BF16" || (k.part == "alpha" && w.dtype == "F64");
        if (!float_type)
            throw lora_error(path, "holds " + key(w.name) + " as " + w.dtype + ", not a float type (F16, BF16 or F32)");
        modules[without_processor(k.module)][k.part] = w;
    }
    const TargetTable table = target_table(targets);
    LoraFile file;
    file.path = path;
    bool kohya = false, diffusers = false;
    for (auto& [name, p] : modules) {
        std::string why;
        const auto kind = kind_of_parts(p, why);
        auto it = table.find(name);
        std::optional<Target> unbuilt;
        if (it == table.end() && kind) unbuilt = unbuilt_layer(name, table, targets);
        if ((it == table.end() && !unbuilt) || !kind) {
            unknown.push_back(name + why);
            continue;
        }
        (starts_with(name, "lora_") ? kohya : diffusers) = true;
        const Target& target = unbuilt ? *unbuilt : it->second;
        LoraModule m;
        m.key = name;
        m.stage = target.stage;
        m.param = target.weight->name;
        m.kind = *kind;
        std::optional<WeightEntry> alpha;
        if (const auto a = p.find("alpha"); a != p.end()) {
            alpha = a->second;
            p.erase(a);
        }
        m.parts = std::move(p);
        check_fit(m, target.weight->shape, path);
        m.alpha = alpha ? alpha_of(*alpha) : static_cast<double>(m.rank);
        if (!std::isfinite(m.alpha)) throw lora_error(path, "has an alpha that is not a finite number: " + key(name));
        if (!unbuilt) file.modules.push_back(std::move(m));  // a layer not built: checked, nothing to change
    }
    if (!unknown.empty())
        throw lora_error(path, "has " + std::to_string(unknown.size()) + " key" + (unknown.size() > 1 ? "s" : "") +
                                   " that match no layer of this model: " + list_keys(unknown) +
                                   " (a LoRA for another model, or a layout this tool does not know)");
    file.format = kohya && diffusers ? "mixed" : kohya ? "kohya" : "diffusers";
    return file;
}

double half_to_double(uint16_t h, bool bf16) {
    if (bf16) {
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    }
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 0) return sign * std::ldexp(mant, -24);
    if (exp == 31) return mant ? NAN : sign * INFINITY;
    return sign * std::ldexp(1024 + mant, exp - 25);
}

// An alpha is one number of any float type.
double scalar_value(const WeightEntry& w, const char* bytes, const std::string& path) {
    if (w.end - w.begin != static_cast<uint64_t>(dtype_size(w.dtype)))
        throw lora_error(path, "has an alpha that is not one number: " + key(w.name) + " " + shape_text(w.shape));
    if (w.dtype == "F64") {
        double d;
        std::memcpy(&d, bytes, 8);
        return d;
    }
    if (w.dtype == "F32") {
        float f;
        std::memcpy(&f, bytes, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes, 2);
    return half_to_double(h, w.dtype == "BF16");
}

// The weight-file reader names files "weights file"; here they are LoRA files.
Error as_lora_error(const Error& e, const std::string& path) {
    const std::string what = e.what(), prefix = "weights file " + path;
    if (starts_with(what, prefix)) return lora_error(path, what.substr(prefix.size() + 1));
    return e;
}

}  // namespace

LoraFile parse_lora(const std::string& file_bytes, const std::string& path, const LoraTargets& targets) {
    std::vector<WeightEntry> index;
    try {
        index = parse_weight_index(file_bytes, path, WeightUse::AnyDtype);
    } catch (const Error& e) {
        throw as_lora_error(e, path);
    }
    const AlphaReader alpha = [&](const WeightEntry& w) { return scalar_value(w, file_bytes.data() + w.begin, path); };
    return describe(index, alpha, path, targets);
}

namespace {

std::shared_ptr<TensorReader> open_lora(const std::string& path) {
    TensorReadOptions options;
    options.what = "LoRA file";
    options.hash = true;
    options.safetensors_only = true;
    try {
        return std::make_shared<TensorReader>(path, options);
    } catch (const Error& e) {
        throw as_lora_error(e, path);
    }
}

}  // namespace

LoraFile read_lora(const std::string& path, const LoraTargets& targets) {
    const auto file = open_lora(path);
    const std::vector<WeightEntry>& index = file->safetensors_index();
    const AlphaReader alpha = [&](const WeightEntry& w) {
        char bytes[8] = {};
        const long k = file->find(w.name);
        if (k >= 0 && w.end - w.begin <= sizeof bytes)
            file->read({static_cast<size_t>(k)}, [&](size_t) { return bytes; });
        return scalar_value(w, bytes, path);
    };
    LoraFile out = describe(index, alpha, path, targets);
    out.file = file;
    out.hash = lora_short_hash_of(file->data_sha256());
    return out;
}

std::vector<int64_t> dora_shape(const std::vector<int64_t>& w, int axis) {
    std::vector<int64_t> s(w.size(), 1);
    if (static_cast<size_t>(axis) < w.size()) s[axis] = w[axis];
    return s;
}

int dora_axis(const std::vector<int64_t>& scale, const std::vector<int64_t>& w) {
    for (int axis : {0, 1})
        if (w.size() >= 2 && scale == dora_shape(w, axis)) return axis;
    return -1;
}

LoraFootprint lora_footprint(const std::vector<const LoraFile*>& files, const std::vector<WeightEntry>& stage_index,
                             const std::string& stage) {
    std::unordered_map<std::string, const WeightEntry*> by_name;
    for (const auto& w : stage_index) by_name[w.name] = &w;
    std::unordered_set<std::string> seen;  // stacked LoRAs change a parameter once
    LoraFootprint f;
    for (const auto* file : files) {
        for (const auto& m : file->modules) {
            const auto it = by_name.find(m.param);
            if (m.stage != stage || it == by_name.end()) continue;
            double bytes = 4;
            for (int64_t d : it->second->shape) bytes *= static_cast<double>(d);
            if (seen.insert(m.param).second) f.touched += bytes;
            f.largest_param = std::max(f.largest_param, bytes);
            // A LoHa's two factors are whole-size at once when the second is a CP product; a plain
            // second product goes a few rows at a time (lora_merge.cpp); the other kinds' one product.
            const bool cp_loha = m.kind == LoraKind::loha && m.has("hada_t2");
            const bool loha = m.kind == LoraKind::loha && !cp_loha;
            f.largest = std::max(f.largest, bytes * (cp_loha ? 2 : 1) + (loha ? kLohaRowChunkBytes : 0));
        }
    }
    return f;
}

std::string lora_short_hash_of(const std::string& data_sha256_hex) { return data_sha256_hex.substr(0, 12); }

std::string lora_short_hash(const std::string& path) { return lora_short_hash_of(open_lora(path)->data_sha256()); }

}  // namespace sd
