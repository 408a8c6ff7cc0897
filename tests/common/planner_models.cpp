#include "planner_models.h"

namespace sdtest {

sd::MemoryModel sd15_memory_model() {
    sd::ModelConfig c;
    c.architecture_json = R"({"unet": {"model_channels": 320, "channel_mult": [1, 2, 4, 4], "attention_resolutions": [4, 2, 1],
        "num_res_blocks": 2, "num_heads": 8, "num_head_channels": -1},
        "vae": {"ch": 128, "ch_mult": [1, 2, 4, 4]}, "text": {"ctx": 77, "width": 768, "heads": 12}})";
    auto m = sd::memory_model(c);
    m.text_weights = 492.3e6;
    m.unet_weights = 3438.5e6;
    m.vae_weights = 198.1e6;
    return m;
}

}  // namespace sdtest
