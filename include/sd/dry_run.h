// --dry-run: the images a job would make, each with its resolved settings and
// the PNG text it would carry, without loading a model or writing a file.
#pragma once
#include <string>
#include <vector>

#include "sd/txt2img.h"

namespace sd {

// One JSON object a line per image the job would write, in generation order
// (this shard's, and with --from-png's keep_position only that image): index,
// prompt, negative_prompt, seed, seed_mode, batch {size, position, number},
// sampler, schedule, steps, scale, width, height, clip_skip, prompt_syntax,
// noise {rng, ensd, subseed, subseed_strength, seed_resize_from,
// brownian_tree, eta}, loras, init and "parameters" (the PNG text; "TI hashes"
// needs the loaded embeddings and is left out). Reads the LoRA and picture files
// for their hashes. Throws sd::Error as plan_run and check_job do.
std::vector<std::string> dry_run_records(const Txt2ImgJob& job);

}  // namespace sd
