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
    // The UNet's input channels (model.json "unet_in_channels"): latent_channels for text
    // to image, 2 * latent_channels + 1 for an inpainting UNet, whose input is the latents,
    // the latent-size mask and the masked picture's latents, in that order. Older exports
    // lack the key: latent_channels.
    int unet_in_channels = 4;
    int downsample_factor = 8;
    int size_multiple = 64;
    int image_size = 0;         // picture edge the model was trained at (model.json "image_size"); 0: not known
    double guidance_scale = 0;  // the scale the model is meant for (model.json "guidance_scale"); 0: not known
    int context_length = 77;
    int context_dim = 768;
    int bos_id = 49406, eos_id = 49407, pad_id = 49407;
    int text_layers_used = 0;  // transformer layers the text encoder runs (model.json); 0: not recorded
    std::vector<float> alphas_cumprod;
    double linear_start = 0, linear_end = 0;  // the betas' range (model.json); 0: not recorded
    std::string source;
    // The checkpoint file's SHA-256 (model.json "source_sha256"; absent for a diffusers
    // folder and older exports): its first 10 digits are A1111's "Model hash".
    std::string source_sha256;
    std::string architecture_json;  // "architecture" of model.json (sizes of the three networks), as JSON text
    // The modules can call the sd::attention operator (model.json "fused_attention";
    // folders exported before it have the other attention strategies only).
    bool fused_attention = false;

    std::string text_encoder_path, unet_path, vae_decoder_path, vocab_path, merges_path;
    // The VAE encoder stage (pictures to the posterior's moments; model.json
    // "files.vae_encoder"); empty for folders exported before it: text to image only.
    std::string vae_encoder_path;
    bool is_inpainting() const { return unet_in_channels == 2 * latent_channels + 1; }

    // SDXL (family "sdxl", model.json "sdxl"): a second text encoder (OpenCLIP
    // bigG, text_encoder_2_path) whose hidden states follow the first's in the
    // UNet's context, and the UNet's vector input y = its pooled output
    // followed by six size embeddings (original size, crop, target size).
    struct Sdxl {
        int text_encoder_width = 0, text_encoder_2_width = 0;
        int text_encoder_2_pad_id = 0;
        int pooled_dim = 0, size_embedding_dim = 0, adm_in_channels = 0;
    } sdxl;
    std::string text_encoder_2_path;
    bool is_sdxl() const { return family == "sdxl"; }

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
