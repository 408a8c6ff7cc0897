// --model FILE: a checkpoint (.safetensors, .ckpt, an SDXL single file) or a
// diffusers folder is exported once (python/sd_export) into a cache of model
// folders and run from there afterwards, with no Python and no hashing:
//
//   CACHE/<first 16 hex of the source's SHA-256>-<kModelExportVersion>[-<args key>]/
//
// CACHE is --model-cache, else $XDG_CACHE_HOME/sd-txt2img/models, else
// ~/.cache/sd-txt2img/models. The args key (8 hex) is there only when the
// export got arguments (--export-arg, the side file SOURCE_NAME.export.json):
// it covers their text and the content of each file they name.
//
// An export is written to ENTRY.tmp-PID and renamed to ENTRY when complete, so
// an interrupted one is never used; processes exporting the same source wait
// on one lock (flock on ENTRY.lock). CACHE/index.tsv maps a source's path,
// size and mtime to its SHA-256, so that later runs do not hash it again; the
// entry's cache.json holds the hash it was made from, which must match.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sd {

// Bumped whenever the export writes a different folder for the same checkpoint
// (python/sd_export), so that older cache entries are not used.
constexpr int kModelExportVersion = 1;

struct ModelCacheOptions {
    std::string cache_dir;                         // empty: default_model_cache_dir()
    std::vector<std::string> export_args;          // --export-arg, after the side file's
    std::function<void(const std::string&)> note;  // progress lines (no newline); may be empty
};

// What --model names, as a folder to load.
struct ResolvedModel {
    std::string dir;   // the exported model folder
    std::string name;  // the checkpoint's name (file name without extension) when it came from the cache
};

// $XDG_CACHE_HOME/sd-txt2img/models (an absolute XDG_CACHE_HOME), else
// $HOME/.cache/sd-txt2img/models. Throws sd::Error when neither is set.
std::string default_model_cache_dir();

// An exported folder (it holds model.json) is returned as it is, and so is a
// folder that is neither exported nor diffusers (loading it names what is
// missing). A checkpoint file or a diffusers folder (model_index.json) is
// looked up in the cache and exported into it when missing. Throws sd::Error
// for a bad source or a failed export (the export's own message), and
// sd::RunFailure when the export dies (killed, out of memory).
ResolvedModel resolve_model(const std::string& model, const ModelCacheOptions& options);

struct ModelCacheEntry {
    std::string path;                  // the entry's folder
    std::string source_sha256;         // from its cache.json
    std::string source_name;           // model.json "source"
    std::vector<std::string> sources;  // paths the index knows for that hash
    uint64_t bytes = 0;
};

// The cache's complete entries, in name order (none when the folder is missing).
std::vector<ModelCacheEntry> list_model_cache(const std::string& cache_dir);

struct ModelCacheCleared {
    int entries = 0;     // complete entries removed
    int partial = 0;     // leftovers of interrupted exports removed
    int busy = 0;        // entries another process is exporting now, left alone
    uint64_t bytes = 0;  // freed
};

// Removes every entry, every leftover of an interrupted export and the index;
// only names the cache itself makes are touched. An entry being exported by
// another process is left (counted in busy).
ModelCacheCleared clear_model_cache(const std::string& cache_dir);

}  // namespace sd
