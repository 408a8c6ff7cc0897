// The JSON lines the tool prints and appends (--json, --manifest, --tokenize),
// one object per line, so that the CLI formats nothing itself.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sd/txt2img.h"

namespace sd {

// --json: one written image (path, prompt, seed, settings, parameters text).
std::string image_record_json(const ImageRecord& r);

// --json: the --grid image.
std::string grid_record_json(const std::string& path, const std::string& parameters, int images);

// --manifest: one written image with the model folder's hash and the shard ("K/N").
std::string manifest_record_json(const ImageRecord& r, const std::string& model_hash, const std::string& shard);

// --tokenize: a prompt's token ids as a JSON array.
std::string token_ids_json(const std::vector<int64_t>& ids);

}  // namespace sd
