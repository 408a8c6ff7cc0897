#include "model_config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.h"
#include "fs_util.h"

namespace sd {

ModelConfig load_model_config(const std::string& dir) {
    if (!is_directory(dir)) throw Error("model folder " + dir + " does not exist (export one with scripts/export_model.py)");
    const std::string path = join_path(dir, "model.json");
    std::ifstream in(path);
    if (!in) throw Error("model folder " + dir + " has no model.json (not an exported model?)");
    std::stringstream ss;
    ss << in.rdbuf();

    ModelConfig c;
    c.dir = dir;
    try {
        auto j = nlohmann::json::parse(ss.str());
        if (!j.is_object()) throw Error(path + ": not a JSON object");
        if (j.value("format", 0) != 1) throw Error(path + ": unsupported model format (expected \"format\": 1)");
        c.family = j.value("family", c.family);
        c.parameterization = j.value("parameterization", c.parameterization);
        c.dtype = j.value("dtype", c.dtype);
        c.scale_factor = j.at("scale_factor").get<double>();
        c.latent_channels = j.at("latent_channels").get<int>();
        c.downsample_factor = j.at("downsample_factor").get<int>();
        c.size_multiple = j.at("size_multiple").get<int>();
        c.image_size = j.value("image_size", 0);
        c.guidance_scale = j.value("guidance_scale", 0.0);
        c.context_length = j.at("context_length").get<int>();
        c.context_dim = j.value("context_dim", c.context_dim);
        c.bos_id = j.value("bos_id", c.bos_id);
        c.eos_id = j.value("eos_id", c.eos_id);
        c.pad_id = j.value("pad_id", c.pad_id);
        c.alphas_cumprod = j.at("alphas_cumprod").get<std::vector<float>>();
        c.source = j.value("source", "");
        if (j.contains("architecture")) c.architecture_json = j["architecture"].dump();
        auto files = j.value("files", nlohmann::json::object());
        auto file = [&](const char* key, const char* def) { return join_path(dir, files.value(key, def)); };
        c.text_encoder_path = file("text_encoder", "text_encoder.pt");
        c.unet_path = file("unet", "unet.pt");
        c.vae_decoder_path = file("vae_decoder", "vae_decoder.pt");
        c.vocab_path = file("vocab", "vocab.json");
        c.merges_path = file("merges", "merges.txt");
    } catch (const nlohmann::json::exception& e) {
        throw Error(path + ": invalid model.json (" + std::string(e.what()) + ")");
    }
    if (c.alphas_cumprod.size() < 2) throw Error(path + ": alphas_cumprod is missing or too short");
    if (c.latent_channels < 1 || c.downsample_factor < 1 || c.size_multiple < 1 || c.context_length < 2 || c.scale_factor <= 0)
        throw Error(path + ": invalid sizes in model.json");
    if (!(c.guidance_scale >= 0 && c.guidance_scale <= 100))
        throw Error(path + ": guidance_scale " + std::to_string(c.guidance_scale) + " is outside 0..100");
    if (c.image_size < 0 || c.image_size % c.size_multiple != 0)
        throw Error(path + ": image_size " + std::to_string(c.image_size) + " is not a multiple of size_multiple");
    for (const auto& f : {c.text_encoder_path, c.unet_path, c.vae_decoder_path, c.vocab_path, c.merges_path})
        if (!file_exists(f)) throw Error("model file " + f + " is missing");
    return c;
}

}  // namespace sd
