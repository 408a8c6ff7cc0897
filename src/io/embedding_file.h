// Textual-inversion embedding files (no LibTorch): which files a run loads,
// which tensor of a file holds the vectors, and the trigger word that calls
// them up in a prompt. The tensors themselves are read on the engine side
// (src/engine/embeddings.cpp).
//
// Formats: AUTOMATIC1111 .safetensors (one tensor "emb_params" [n, D]) and .pt
// (string_to_param["*"]); diffusers learned_embeds.safetensors / .bin (one
// tensor [D] or [n, D] named by its token); for SDXL, A1111's pair "clip_l"
// [n, D1] and "clip_g" [n, D2] in one file.
#pragma once
#include <string>
#include <vector>

namespace sd {

// The --embedding files in order, then every embedding file (.safetensors,
// .pt, .bin) of `dir` and its subfolders (as A1111 reads its embeddings
// folder), sorted by path. Throws sd::Error naming a file or folder that does
// not exist, a folder given as a file and the other way round.
std::vector<std::string> embedding_files(const std::vector<std::string>& files, const std::string& dir);

// Whether the name ends in an extension embeddings come in.
bool is_embedding_file_name(const std::string& path);

// Of a file's tensor names, the one holding the vectors: "emb_params", else
// "string_to_param.*", else the file's only tensor. Throws sd::Error naming
// the file when there is none or several to choose from.
std::string embedding_tensor_name(const std::vector<std::string>& names, const std::string& path);

// SDXL (A1111's format): the file's two tensors, {"clip_l", "clip_g"}, for the
// first and the second text encoder. Throws sd::Error naming the file when it is
// not such a pair (an SD 1.x or 2.x embedding of one text encoder).
std::vector<std::string> sdxl_embedding_tensor_names(const std::vector<std::string>& names, const std::string& path);

// The word that calls the embedding up: the diffusers format's key (its
// token), else (A1111's formats: "emb_params", "string_to_param.*") the file's
// name without its extension.
std::string embedding_trigger(const std::string& path, const std::string& tensor_name);

// Refuses (sd::Error, "WHAT: ...") a trigger that cannot be typed as one word
// of a prompt: empty, longer than 256 bytes, holding whitespace, a control
// character or a character of the prompt syntax ( ) [ ] : < > or a
// backslash, the
// keyword BREAK, or one character alone (a trigger "a" would replace every
// "a" of every prompt). A1111 takes any file name as a trigger; these are the
// ones its own prompt parser would cut apart or swallow.
void check_trigger_word(const std::string& trigger, const std::string& what);

// Whether two triggers are the same word up to ASCII case.
bool same_ignoring_case(const std::string& a, const std::string& b);

// A1111's short hash of an embedding file, written in PNG text
// ("TI hashes"): the first 10 hex digits of its SHA-256.
std::string embedding_short_hash(const std::string& path);

}  // namespace sd
