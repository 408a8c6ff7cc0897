// --manifest: what a run's images need to be checked for completeness across
// shards (one JSON line per image, written by the CLI).
#pragma once
#include <string>

namespace sd {

// A content hash of a model folder: 16 hex digits over the bytes of every
// regular file in it, in name order (the model's identity for manifests; any
// change to its weights, code or settings changes it). Reads the whole folder
// once (about a second per GB). Throws sd::Error when it cannot be read.
std::string model_folder_hash(const std::string& model_dir);

}  // namespace sd
