#include "sd/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/fs_util.h"
#include "io/json_depth.h"
#include "sd/error.h"
#include "sd/sampler_catalog.h"
#include "sd/value_rules.h"

namespace sd {

namespace {

// model.json is read from a folder a user may have downloaded: every number is
// checked against what an SD-like network can be before anything is sized
// from it (a context length of 1e9 once allocated 22 GB before failing).
constexpr long long kMaxChannels = 1 << 16;

// A whole number in [lo, hi], or an error naming the file, the key and the range.
int checked_int(const nlohmann::json& j, const char* key, int def, long long lo, long long hi, const std::string& path,
                bool required = false) {
    if (!j.contains(key)) {
        if (required) throw Error(path + ": \"" + key + "\" is missing");
        return def;
    }
    const auto& v = j[key];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
        v.get<long long>() < lo || v.get<long long>() > hi)
        throw Error(path + ": \"" + key + "\" must be a whole number from " + std::to_string(lo) + " to " +
                    std::to_string(hi) + ", got " + v.dump());
    return v.get<int>();
}

double checked_real(const nlohmann::json& j, const char* key, double def, double lo, double hi, const std::string& path,
                    bool required = false) {
    if (!j.contains(key)) {
        if (required) throw Error(path + ": \"" + key + "\" is missing");
        return def;
    }
    const auto& v = j[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi) {
        std::ostringstream range;
        range << lo << " to " << hi;
        throw Error(path + ": \"" + key + "\" must be a number from " + range.str() + ", got " + v.dump());
    }
    return v.get<double>();
}

std::string checked_string(const nlohmann::json& j, const char* key, const std::string& def, const std::string& path) {
    if (!j.contains(key)) return def;
    if (!j[key].is_string()) throw Error(path + ": \"" + key + "\" must be a string, got " + j[key].dump());
    return j[key].get<std::string>();
}

void check_one_of(const std::string& value, std::initializer_list<const char*> known, const char* key,
                  const std::string& path, const std::string& hint = "") {
    std::string list;
    for (const char* k : known) {
        if (value == k) return;
        list += std::string(list.empty() ? "" : ", ") + k;
    }
    throw Error(path + ": unknown " + key + " \"" + value + "\" (this build runs " + list + ")" + hint);
}

// Every number inside "architecture" (the networks' sizes) must be finite and
// of a size a network can have; memory_model() reads them.
void check_architecture_numbers(const nlohmann::json& a, const std::string& path, const std::string& at) {
    if (a.is_object()) {
        for (const auto& [k, v] : a.items()) check_architecture_numbers(v, path, at + "." + k);
    } else if (a.is_array()) {
        for (size_t i = 0; i < a.size(); ++i)
            check_architecture_numbers(a[i], path, at + "[" + std::to_string(i) + "]");
    } else if (a.is_number()) {
        const double v = a.get<double>();
        if (!std::isfinite(v) || std::fabs(v) > static_cast<double>(kMaxChannels) * 16)
            throw Error(path + ": " + at + " = " + a.dump() + " is not a size a network can have");
    }
}

// "default_sampler", "default_steps", "default_schedule": a recipe the
// sampler list accepts, or one line naming the key.
void read_default_recipe(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
    c.default_sampler = checked_string(j, "default_sampler", "", path);
    c.default_schedule = checked_string(j, "default_schedule", "", path);
    c.default_steps = checked_int(j, "default_steps", 0, 1, kStepsRange.hi, path);
    if (c.default_sampler.empty() && (!c.default_schedule.empty() || c.default_steps > 0))
        throw Error(path + ": \"default_steps\" and \"default_schedule\" need the \"default_sampler\" they belong to");
    if (c.default_sampler.empty()) return;
    try {
        check_sampler_settings(c.default_sampler, c.default_schedule.empty() ? "default" : c.default_schedule,
                               c.default_steps > 0 ? c.default_steps : 1);
    } catch (const Error& e) {
        throw Error(path + ": the recorded default sampler: " + e.what());
    }
}

// "sdxl": the second text encoder and the UNet's vector input, whose widths
// must add up (the vector is built from them before the UNet checks it).
void read_sdxl(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
    if (!j.contains("sdxl") || !j["sdxl"].is_object())
        throw Error(
            path +
            ": family sdxl needs the \"sdxl\" object (re-export the checkpoint with this build's export_model.py)");
    const auto& s = j["sdxl"];
    const std::string at = path + ": sdxl";
    auto& x = c.sdxl;
    x.text_encoder_width = checked_int(s, "text_encoder_width", 0, 1, kMaxChannels, at, true);
    x.text_encoder_2_width = checked_int(s, "text_encoder_2_width", 0, 1, kMaxChannels, at, true);
    x.text_encoder_2_pad_id = checked_int(s, "text_encoder_2_pad_id", 0, 0, 1 << 24, at, true);
    x.pooled_dim = checked_int(s, "pooled_dim", 0, 1, kMaxChannels, at, true);
    x.size_embedding_dim = checked_int(s, "size_embedding_dim", 0, 2, kMaxChannels, at, true);
    x.adm_in_channels = checked_int(s, "adm_in_channels", 0, 1, kMaxChannels * 8, at, true);
    if (x.size_embedding_dim % 2 != 0) throw Error(at + ": size_embedding_dim must be even (cosines, then sines)");
    if (x.text_encoder_width + x.text_encoder_2_width != c.context_dim)
        throw Error(at + ": text_encoder_width + text_encoder_2_width must equal context_dim " +
                    std::to_string(c.context_dim));
    if (x.pooled_dim + 6 * x.size_embedding_dim != x.adm_in_channels)
        throw Error(at + ": adm_in_channels must be pooled_dim + 6 * size_embedding_dim");
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& dir) {
    const std::string path = join_path(dir, "model.json");
    ModelConfig c;
    c.dir = dir;
    try {
        auto j = parse_json_limited(json_text, path + ": invalid model.json (nested more than " +
                                                   std::to_string(kMaxJsonDepth) + " levels deep)");
        if (!j.is_object()) throw Error(path + ": not a JSON object");
        if (!j.contains("format") || j["format"] != 1)
            throw Error(path + ": unsupported model format (expected \"format\": 1)");
        c.family = checked_string(j, "family", c.family, path);
        check_one_of(c.family, {"sd1", "sd2", "sdxl"}, "model family", path,
                     "; export the checkpoint with this build's export_model.py");
        c.parameterization = checked_string(j, "parameterization", c.parameterization, path);
        check_one_of(c.parameterization, {"eps", "v"}, "parameterization", path);
        c.dtype = checked_string(j, "dtype", c.dtype, path);
        // q8_0: the UNet's layers in 8-bit blocks, the rest float32 (docs/model-format.md)
        check_one_of(c.dtype, {"float32", "float16", "bfloat16", "q8_0"}, "dtype", path);
        c.scale_factor = checked_real(j, "scale_factor", 0, 1e-6, 100, path, true);
        c.latent_channels = checked_int(j, "latent_channels", 0, 1, 64, path, true);
        c.unet_in_channels = checked_int(j, "unet_in_channels", c.latent_channels, 1, 129, path);
        if (c.unet_in_channels != c.latent_channels && !c.is_inpainting())
            throw Error(path + ": \"unet_in_channels\" must be " + std::to_string(c.latent_channels) +
                        " (text to image) or " + std::to_string(2 * c.latent_channels + 1) +
                        " (inpainting: latents, mask, masked-picture latents), got " +
                        std::to_string(c.unet_in_channels));
        c.downsample_factor = checked_int(j, "downsample_factor", 0, 1, 64, path, true);
        c.size_multiple = checked_int(j, "size_multiple", 0, 1, 1024, path, true);
        c.image_size = checked_int(j, "image_size", 0, 0, 16384, path);
        c.guidance_scale = checked_real(j, "guidance_scale", 0, 0, 100, path);
        c.context_length = checked_int(j, "context_length", 0, 2, 1024, path, true);
        c.context_dim = checked_int(j, "context_dim", c.context_dim, 1, kMaxChannels, path);
        c.bos_id = checked_int(j, "bos_id", c.bos_id, 0, 1 << 24, path);
        c.eos_id = checked_int(j, "eos_id", c.eos_id, 0, 1 << 24, path);
        c.pad_id = checked_int(j, "pad_id", c.pad_id, 0, 1 << 24, path);
        c.text_layers_used = checked_int(j, "text_layers_used", 0, 0, 1000, path);
        if (j.contains("fused_attention")) {
            if (!j["fused_attention"].is_boolean()) throw Error(path + ": \"fused_attention\" must be true or false");
            c.fused_attention = j["fused_attention"].get<bool>();
        }
        if (!j.contains("alphas_cumprod") || !j["alphas_cumprod"].is_array())
            throw Error(path + ": \"alphas_cumprod\" (the noise schedule) is missing");
        const auto& ac = j["alphas_cumprod"];
        if (ac.size() < 2 || ac.size() > 100000)
            throw Error(path + ": \"alphas_cumprod\" has " + std::to_string(ac.size()) +
                        " entries; a noise schedule has 2 to 100000 (SD's have 1000)");
        for (const auto& v : ac) {
            // Checked as the float it is kept as too: 1e-50 is above 0 but its float is 0.
            if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() <= 1) || !(v.get<float>() > 0))
                throw Error(path + ": \"alphas_cumprod\" holds " + v.dump() + "; every entry must be in (0, 1]");
            c.alphas_cumprod.push_back(v.get<float>());
        }
        c.linear_start = checked_real(j, "linear_start", 0, 0, 1, path);
        c.linear_end = checked_real(j, "linear_end", 0, 0, 1, path);
        c.source = checked_string(j, "source", "", path);
        c.source_sha256 = checked_string(j, "source_sha256", "", path);
        if (!c.source_sha256.empty() && (c.source_sha256.size() != 64 ||
                                         c.source_sha256.find_first_not_of("0123456789abcdef") != std::string::npos))
            throw Error(path + ": \"source_sha256\" must be 64 lower-case hex digits");
        if (c.is_sdxl()) read_sdxl(j, path, c);
        read_default_recipe(j, path, c);
        if (j.contains("architecture")) {
            if (!j["architecture"].is_object()) throw Error(path + ": \"architecture\" must be a JSON object");
            check_architecture_numbers(j["architecture"], path, "architecture");
            const auto& a = j["architecture"];
            // The token ids index the text encoder's embedding table.
            if (a.contains("text") && a["text"].is_object() && a["text"].contains("vocab")) {
                const int vocab = checked_int(a["text"], "vocab", 0, 1, 1 << 24, path + ": architecture.text");
                for (auto [name, id] :
                     {std::pair<const char*, int>{"bos_id", c.bos_id}, {"eos_id", c.eos_id}, {"pad_id", c.pad_id}})
                    if (id >= vocab)
                        throw Error(path + ": " + name + " " + std::to_string(id) + " is outside the text encoder's " +
                                    std::to_string(vocab) + "-token vocabulary");
            }
            c.architecture_json = a.dump();
        }
        auto files = j.value("files", nlohmann::json::object());
        if (!files.is_object()) throw Error(path + ": \"files\" must be a JSON object");
        auto file = [&](const char* key, const char* def) {
            const std::string name = checked_string(files, key, def, path + ": files");
            if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
                throw Error(path + ": files." + key + " must be a file name inside the model folder, got \"" + name +
                            "\"");
            return join_path(dir, name);
        };
        c.text_encoder_path = file("text_encoder", "text_encoder.pt");
        c.unet_path = file("unet", "unet.pt");
        c.vae_decoder_path = file("vae_decoder", "vae_decoder.pt");
        c.vocab_path = file("vocab", "vocab.json");
        c.merges_path = file("merges", "merges.txt");
        if (c.is_sdxl()) c.text_encoder_2_path = file("text_encoder_2", "text_encoder_2.pt");
        if (files.contains("vae_encoder")) c.vae_encoder_path = file("vae_encoder", "vae_encoder.pt");
    } catch (const nlohmann::json::exception& e) {
        throw Error(path + ": invalid model.json (" + std::string(e.what()) + ")");
    }
    if (c.image_size % c.size_multiple != 0)
        throw Error(path + ": image_size " + std::to_string(c.image_size) + " is not a multiple of size_multiple");
    return c;
}

ModelConfig load_model_config(const std::string& dir) {
    if (!file_exists(dir))
        throw Error("model folder " + dir + " does not exist (export one with scripts/export_model.py)");
    if (!is_directory(dir))
        throw Error("model path " + dir + " is a file, not a folder (give the folder scripts/export_model.py wrote)");
    const std::string path = join_path(dir, "model.json");
    if (!file_exists(path)) throw Error("model folder " + dir + " has no model.json (not an exported model?)");
    // model.json is a few KB; a FIFO or device in its place is refused, not read.
    const ModelConfig c = parse_model_config(read_file_capped(path, 16u << 20, "model file"), dir);
    for (const auto& f : {c.text_encoder_path, c.unet_path, c.vae_decoder_path, c.vocab_path, c.merges_path,
                          c.text_encoder_2_path, c.vae_encoder_path}) {
        if (f.empty()) continue;
        if (!file_exists(f)) throw Error("model file " + f + " is missing");
        check_regular_file(f, "model file");
    }
    return c;
}

}  // namespace sd
