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

// --manifest, checked before anything is written. Refused with one line: a
// path where something other than a manifest is (a folder, a FIFO, an image:
// an existing file whose first line is not one of our JSON records), and a
// name the run's images could take (a .png in the output folder or its
// previews folder). A missing or empty file is fine. Throws sd::Error.
void check_manifest_path(const std::string& manifest, const std::string& outdir);

// Whether the manifest holds lines already (a later run adds to its set).
bool manifest_has_records(const std::string& manifest);

}  // namespace sd
