// LoRA on the run side: AUTOMATIC1111's prompt tags <lora:NAME>, <lora:NAME:WEIGHT>,
// <lora:NAME:TE_WEIGHT:UNET_WEIGHT> (or te=W / unet=W), and --lora FILE[:WEIGHT].
// They choose which LoRA files are merged into the model; the text encoder never sees the tags.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "sd/settings.h"

namespace sd {

struct LoraTag {
    std::string name;
    double text_weight = 1, unet_weight = 1;
};

// The tags of a prompt, in order (<lyco:...> is read as <lora:...>, as A1111 does). Throws sd::Error naming `where` and
// the tag when a weight is not a number or the name is empty.
std::vector<LoraTag> find_lora_tags(const std::string& prompt, const std::string& where);

// The prompt with its A1111 extra-network tags removed, <lora:...> and any other
// <type:...> (A1111 removes them all, whether it knows the type or not): what the text
// encoder sees.
std::string strip_network_tags(const std::string& prompt);

// The prompt's extra-network tags that are not LoRA tags (<hypernet:x:1>, ...): removed
// from the text as A1111 removes them, but not applied here; the run warns about them.
std::vector<std::string> unapplied_network_tags(const std::string& prompt);

// "<lora:NAME:W>" (or "<lora:NAME:TE:UNET>" when the two weights differ), as A1111 writes it.
std::string lora_tag_text(const std::string& name, double text_weight, double unet_weight);

// --lora FILE[:WEIGHT]: a trailing ":number" is the weight (for both parts),
// anything else belongs to the path. Throws sd::Error for an empty path.
LoraUse parse_lora_flag(const std::string& text);

// A prompt's LoRAs: its tags, found as NAME.safetensors in lora_dir (or, as A1111
// finds them, as the one NAME.safetensors in its subfolders), then the --lora files
// (the order of the PNG text, so --from-png merges alike). Throws sd::Error naming
// `where` for a tag without a lora_dir, and for a name that two files below it share.
std::vector<LoraUse> prompt_loras(const std::string& prompt, const std::string& where, const std::string& lora_dir,
                                  const std::vector<LoraUse>& flag_loras);

// Fills each LoRA's A1111 short hash (the PNG text's "Lora hashes"), reading
// each file once (`cache`: path -> hash, kept across calls). Throws sd::Error
// for a missing, special or corrupt file, naming the tag that named it.
void hash_lora_files(std::vector<LoraUse>& loras, std::map<std::string, std::string>& cache);

// A1111's "Lora hashes" value: "name: hash12, name: hash12", quoted.
std::string lora_hashes_text(const std::vector<LoraUse>& loras);

}  // namespace sd
