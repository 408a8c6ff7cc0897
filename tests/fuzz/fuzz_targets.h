// The fuzz targets: one function per parser, called by the libFuzzer
// harnesses (fuzz_main.cpp, SD_FUZZ=ON) and by the replay unit test
// (tests/unit/test_fuzz_inputs.cpp) over the committed corpus and the inputs
// that once crashed. A target catches only the errors its function documents
// (sd::Error): anything else (another exception, a broken invariant, which
// throws Finding) escapes, and the sanitizers report memory errors and UB.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace sdfuzz {

// A result that breaks what the function promises.
struct Finding : std::logic_error {
    using std::logic_error::logic_error;
};

using Target = void (*)(const uint8_t* data, size_t size);

// Weight-file header (io/weight_file.h parse_weight_index): the input is a whole file.
void weight_index(const uint8_t* data, size_t size);
// model.json (sd/model_config.h parse_model_config): the input is its text.
void model_config(const uint8_t* data, size_t size);
// Prompt files (sd/prompts.h parse_prompts and its line reader): the first
// byte's low bit chooses JSON lines, the rest is the file.
void prompts(const uint8_t* data, size_t size);
// A1111 weighting syntax (text/prompt_weights.h parse_prompt_weights): never throws.
void prompt_weights(const uint8_t* data, size_t size);
// Text clean-up and the CLIP tokenizer of models/clip (text/text_clean.h,
// sd/tokenizer.h, tokenize_prompt): never throw on text.
void tokenizer(const uint8_t* data, size_t size);
// PNG text chunks (io/png_text.h): the first byte's low bit chooses between
// reading (and adding a chunk to) the rest as a PNG, and adding the rest as
// keyword NUL text to a valid PNG and reading it back.
void png_text(const uint8_t* data, size_t size);
// The pickle of a torch.save archive (io/torch_pickle.h parse_torch_pickle):
// the input is data.pkl.
void torch_pickle(const uint8_t* data, size_t size);

// A LoRA file (io/lora_keys.h parse_lora) against a small fixed model: the input is a whole file.
void lora_file(const uint8_t* data, size_t size);

// A picture or mask a user hands in (io/image_reader.h decode_image /
// decode_mask, under small limits): the first byte's low bit chooses the mask
// reader, the rest is the file. What it accepts then goes through the resize
// modes and the mask blur (src/image/).
void image_reader(const uint8_t* data, size_t size);

struct Named {
    const char* name;  // also the folder name under tests/fuzz/corpus/ and tests/data/fuzz-inputs/
    Target run;
};
const std::vector<Named>& all_targets();

}  // namespace sdfuzz
