// model.json of an exported model directory (see docs/model-format.md).
#pragma once
#include <string>
#include <vector>

namespace sd {

struct ModelConfig {
    std::string dir;
    std::string family = "sd1";
    std::string parameterization = "eps";
    std::string dtype = "float32";
    double scale_factor = 0.18215;
    int latent_channels = 4;
    int downsample_factor = 8;
    int size_multiple = 64;
    int image_size = 0;  // picture edge the model was trained at (model.json "image_size"); 0: not known
    double guidance_scale = 0;  // the scale the model is meant for (model.json "guidance_scale"); 0: not known
    int context_length = 77;
    int context_dim = 768;
    int bos_id = 49406, eos_id = 49407, pad_id = 49407;
    std::vector<float> alphas_cumprod;
    std::string source;
    std::string architecture_json;  // "architecture" of model.json (sizes of the three networks), as JSON text

    std::string text_encoder_path, unet_path, vae_decoder_path, vocab_path, merges_path;

    // The sampler recipe the model is meant for (model.json "default_sampler",
    // "default_steps", "default_schedule"; with guidance_scale above), used by
    // the CLI where the user gives no flag. Empty / 0: not recorded.
    std::string default_sampler, default_schedule;
    int default_steps = 0;
};

// Reads DIR/model.json and checks that every file it names exists.
// Throws sd::Error with a one-line message naming what is missing or wrong.
ModelConfig load_model_config(const std::string& dir);

// The checks of load_model_config on model.json's text already read, except
// that the files it names may be missing (the fuzz harness calls this). `dir`
// is the folder the paths are joined to and that messages name.
ModelConfig parse_model_config(const std::string& json_text, const std::string& dir);

}  // namespace sd
