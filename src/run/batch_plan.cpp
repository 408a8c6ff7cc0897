#include "run/batch_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/printable.h"
#include "sd/error.h"
#include "sd/loras.h"
#include "sd/noise_rules.h"
#include "sd/sampler_catalog.h"
#include "sd/version.h"
#include "text/prompt_schedule.h"
#include "text/prompt_weights.h"

namespace sd {

namespace {

// A run larger than this is almost certainly a typo in --n_iter.
constexpr int64_t kMaxImages = 1000000;

// The negative prompt needs GenerateSettings::negative_prompt in the pipeline
// (it encodes it instead of ""). Until the pipeline has that field, a
// non-empty negative prompt is refused instead of silently ignored.
template <class S, class = void>
struct HasNegativePrompt : std::false_type {};
template <class S>
struct HasNegativePrompt<S, std::void_t<decltype(std::declval<S&>().negative_prompt)>> : std::true_type {};

template <class S>
void set_negative_prompt(S& settings, const std::string& negative, const std::string& where) {
    if constexpr (HasNegativePrompt<S>::value) {
        settings.negative_prompt = negative;
    } else if (!negative.empty()) {
        throw Error(where + ": negative prompts are not supported by this build's pipeline");
    }
}

bool same_batch_settings(const PromptItem& a, const PromptItem& b) {
    return a.negative_prompt == b.negative_prompt && a.settings.sampler == b.settings.sampler &&
           a.settings.schedule == b.settings.schedule && a.settings.prompt_weights == b.settings.prompt_weights &&
           a.settings.beta_alpha == b.settings.beta_alpha && a.settings.beta_beta == b.settings.beta_beta &&
           a.settings.steps == b.settings.steps && a.settings.scale == b.settings.scale &&
           a.settings.height == b.settings.height && a.settings.width == b.settings.width && a.n_iter == b.n_iter &&
           a.seed == b.seed && a.settings.clip_skip == b.settings.clip_skip && a.settings.loras == b.settings.loras &&
           a.settings.init == b.settings.init && a.settings.noise == b.settings.noise &&
           a.settings.hires == b.settings.hires;
}

// A line's own noise options (the flags' rules, named by its place). compvis
// seeds come from one generator for the run, which cannot change its source.
void set_line_noise(PromptItem& item, const PromptOverrides& o, SeedMode mode) {
    if (mode != SeedMode::per_image)
        throw Error(item.where +
                    ": noise options (rng, ensd, subseed, ...) on a line need --seed-mode per-image (compvis noise "
                    "comes from one generator for the run)");
    NoiseSettings& n = item.settings.noise;
    try {
        if (o.rng) n.rng = parse_rng(*o.rng);
        if (o.ensd) n.ensd = *o.ensd;
        if (o.subseed) n.subseed = *o.subseed;
        if (o.subseed_strength) n.subseed_strength = *o.subseed_strength;
        if (o.seed_resize_from) parse_seed_resize_from(*o.seed_resize_from, n);
        check_noise_settings(n);
    } catch (const Error& e) {
        throw Error(item.where + ": " + e.what());
    }
}

// The prompt's <lora:NAME:W> tags, found in --lora-dir, then --lora's files: the
// order of the tags in the PNG text (--lora's written last), so --from-png merges alike.
PromptItem resolve_item(const Txt2ImgJob& job, const PromptLine& line, int number) {
    PromptItem item;
    item.prompt = line.prompt;
    item.number = number;
    item.line = line.line;
    item.where = line.where();
    const auto& o = line.overrides;
    item.negative_prompt = o.negative_prompt.value_or(job.negative_prompt);
    item.settings = job.settings;
    if (o.steps) item.settings.steps = *o.steps;
    if (o.scale) item.settings.scale = *o.scale;
    if (o.height) item.settings.height = *o.height;
    if (o.width) item.settings.width = *o.width;
    if (o.init_img) item.settings.init.path = *o.init_img;
    if (o.mask) item.settings.init.mask = *o.mask;
    if (o.outpaint) item.settings.init.outpaint = *o.outpaint;
    if (o.strength) item.settings.init.strength = *o.strength;
    if (o.hires_scale) {  // a line's own scale replaces --hires-size too
        item.settings.hires.scale = *o.hires_scale;
        item.settings.hires.width = item.settings.hires.height = 0;
    }
    if (o.hires_steps) item.settings.hires.steps = *o.hires_steps;
    if (o.hires_strength) item.settings.hires.strength = *o.hires_strength;
    if (o.hires_upscaler) item.settings.hires.upscaler = *o.hires_upscaler;
    item.n_iter = o.n_iter.value_or(job.n_iter);
    try {                               // before any model loads
        if (o.sampler || o.schedule) {  // the web UI's names become ours
            const SamplerName named = settle_sampler_names(o.sampler.value_or(item.settings.sampler),
                                                           o.schedule.value_or(""), item.settings.schedule);
            item.settings.sampler = named.sampler;
            item.settings.schedule = named.schedule;
        }
        check_sampler_settings(item.settings.sampler, item.settings.schedule, item.settings.steps);
    } catch (const Error& e) {
        if (item.line == 0) throw;
        throw Error(item.where + ": " + e.what());
    }
    item.seed = o.seed;
    if (o.sets_noise()) set_line_noise(item, o, job.seed_mode);
    if (item.seed && job.seed_mode != SeedMode::per_image)
        throw Error(item.where +
                    ": \"seed\" needs --seed-mode per-image (compvis seeds come from one generator for the run)");
    set_negative_prompt(item.settings, item.negative_prompt, item.where);
    // Only the A1111 syntax reads <lora:...> tags; in plain text they are words like any other.
    item.settings.loras =
        item.settings.prompt_weights
            ? prompt_loras(item.prompt, item.line == 0 ? "--prompt" : item.where, job.lora_dir, job.loras)
            : job.loras;
    if (item.settings.prompt_weights) {
        const bool flag = item.line == 0;
        // And each text A1111's composition (AND, a part's weight; the prompt only) and prompt
        // editing make of it, in both passes of a hires fix.
        const GenerateSettings& s = item.settings;
        const int first = prompt_schedule_steps(s.sampler, s.steps);
        const int second = prompt_schedule_steps(s.sampler, s.hires.steps > 0 ? s.hires.steps : s.steps);
        auto check = [&](const std::string& prompt, const std::string& what, bool composed) {
            check_prompt_weights(prompt, what);
            // What the engine reads: the prompt without its extra-network tags (the negative as it is).
            const std::string text = composed ? strip_network_tags(prompt) : prompt;
            std::vector<std::string> parts = {text};
            if (composed) {
                parts.clear();
                for (auto& part : composed_parts(text)) {
                    if (!std::isfinite(part.weight))
                        throw Error(what + ": the weight of the part \"" + printable(part.text) +
                                    "\" (after AND, or at the end) is not a finite number");
                    parts.push_back(std::move(part.text));
                }
            }
            std::vector<ScheduledText> texts;
            try {
                for (const auto& part : parts) {
                    for (auto& e : prompt_schedule(part, first)) texts.push_back(std::move(e));
                    if (s.hires.active())
                        for (auto& e : prompt_schedule(part, second, first)) texts.push_back(std::move(e));
                }
            } catch (const Error& e) {
                throw Error(what + ": " + e.what());
            }
            for (const auto& e : texts) check_prompt_weights(e.text, what);
        };
        check(item.prompt, flag ? "--prompt" : item.where + ": the prompt", true);
        check(item.negative_prompt, flag ? "--negative-prompt" : item.where + ": the negative prompt", false);
    }
    return item;
}

std::string format_number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

// Letters (any UTF-8), digits, '-', '_' and '.' kept; runs of anything else become one '_'.
std::string prompt_slug(const std::string& prompt) {
    std::string out;
    for (size_t i = 0; i < prompt.size();) {
        const unsigned char c = static_cast<unsigned char>(prompt[i]);
        size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
        len = std::min(len, prompt.size() - i);
        const bool keep = c >= 0x80 || std::isalnum(c) || c == '-' || c == '_' || (c == '.' && !out.empty());
        if (keep) {
            if (out.size() + len > 80) break;
            out.append(prompt, i, len);
        } else if (!out.empty() && out.back() != '_') {
            if (out.size() + 1 > 80) break;
            out += '_';
        }
        i += len;
    }
    while (!out.empty() && (out.back() == '_' || out.back() == '.')) out.pop_back();
    return out.empty() ? "_" : out;
}

}  // namespace

const char* seed_mode_name(SeedMode mode) { return mode == SeedMode::per_image ? "per-image" : "compvis"; }

void check_name_pattern(const std::string& pattern) {
    if (pattern.empty()) throw Error("--name must not be empty");
    if (pattern.find('/') != std::string::npos)
        throw Error("--name \"" + pattern + "\" must be a file name, without '/'");
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] == '}') throw Error("--name \"" + pattern + "\": '}' without '{'");
        if (pattern[i] != '{') continue;
        const size_t end = pattern.find('}', i);
        if (end == std::string::npos) throw Error("--name \"" + pattern + "\": '{' without '}'");
        const std::string key = pattern.substr(i + 1, end - i - 1);
        if (key != "index" && key != "seed" && key != "prompt")
            throw Error("--name \"" + pattern + "\": unknown placeholder {" + key +
                        "} (use {index}, {seed}, {prompt})");
        i = end;
    }
}

std::string expand_name(const std::string& pattern, int index, uint64_t seed, const std::string& prompt) {
    std::string out;
    for (size_t i = 0; i < pattern.size(); ++i) {
        const size_t end = pattern[i] == '{' ? pattern.find('}', i) : std::string::npos;
        if (end == std::string::npos) {
            out += pattern[i];
            continue;
        }
        const std::string key = pattern.substr(i + 1, end - i - 1);
        if (key == "index") {
            char buf[16];
            std::snprintf(buf, sizeof buf, "%05d", index);
            out += buf;
        } else if (key == "seed") {
            out += std::to_string(seed);
        } else {
            out += prompt_slug(prompt);
        }
        i = end;
    }
    if (out.size() < 4 || out.compare(out.size() - 4, 4, ".png") != 0) out += ".png";
    return out;
}

// The "Schedule type" labels are the sampler catalog's (core/sampler_list.h).
std::string schedule_a1111_name(const std::string& schedule) { return schedule_label(schedule); }

std::string schedule_from_a1111_name(const std::string& name) {
    const std::string ours = schedule_name(name);  // "Automatic" is the sampler's own, as in the web UI
    return schedule_label(ours) != ours ? ours : "";
}

namespace {

// A value as A1111 writes it: in JSON quotes when it holds what would end it.
std::string quoted(const std::string& v) {
    return v.find_first_of(",:\"\n") == std::string::npos ? v : nlohmann::json(v).dump();
}

}  // namespace

namespace {

// A1111's "TI hashes" value: "trigger: hash, ..." of the embeddings the prompt or negative prompt uses.
std::string ti_hashes(const PromptItem& item, const std::vector<EmbeddingInfo>& embeddings) {
    std::vector<AddedWord> words;
    for (const auto& e : embeddings) words.push_back({e.trigger, 0, 1});
    std::vector<bool> used(words.size(), false);
    for (const auto* text : {&item.prompt, &item.negative_prompt})
        for (int k : trigger_words_used(*text, words)) used[k] = true;
    std::string out;
    for (size_t k = 0; k < words.size(); ++k)
        if (used[k]) out += (out.empty() ? "" : ", ") + embeddings[k].trigger + ": " + embeddings[k].hash;
    return out;
}

// A picture to start from: A1111's names (Denoising strength, Mask blur,
// Mask mode, Resize mode, Masked content) where it has them, and the files'
// SHA-256, which --from-png compares with the pictures it is given.
std::string init_image_text(const InitImage& init) {
    if (!init.active()) return "";
    std::string text =
        ", Denoising strength: " + format_number(init.strength) + ", Init image hash: " + init.image_hash;
    if (!init.mask.empty()) text += ", Mask hash: " + init.mask_hash;
    if (init.mask_blur > 0) text += ", Mask blur: " + std::to_string(init.mask_blur);
    if (init.invert_mask) text += ", Mask mode: Inpaint not masked";
    if (!init.outpaint.empty()) text += ", Outpaint: " + quoted(init.outpaint);
    if (init.resize_mode != "just") text += ", Resize mode: " + init.resize_mode;
    if (init.masked_content != "original") text += ", Masked content: " + init.masked_content;
    return text;
}

// The web UI's variation fields, after "Model" as it writes them, only where they
// change the noise: "Variation seed" and its strength, "Seed resize from". Every
// image of a run blends toward the same variation seed (engine/web_noise.h): the
// image's own, as the web UI records it.
std::string variation_text(const NoiseSettings& n) {
    std::string text;
    if (n.subseed && n.subseed_strength != 0)
        text += ", Variation seed: " + std::to_string(*n.subseed) +
                ", Variation seed strength: " + format_number(n.subseed_strength);
    if (n.seed_resize_from_w > 0 && n.seed_resize_from_h > 0)
        text +=
            ", Seed resize from: " + std::to_string(n.seed_resize_from_w) + "x" + std::to_string(n.seed_resize_from_h);
    return text;
}

// The other noise fields: ENSD where it is not 0; "RNG" always, as the web UI names its
// sources ("CPU"; "NV", whose numbers are its GPU's: the web UI leaves its GPU and NV
// unwritten, but this tool's texts from before nv have no "RNG" and mean cpu); the
// sampler's eta where not the default ("Eta" for k-diffusion samplers, default 1,
// "Eta DDIM" for DDIM's, default 0); this tool's Brownian-tree seeding when it is k-diffusion's own.
std::string noise_text(const NoiseSettings& n, SamplerFamily family) {
    std::string text;
    if (n.ensd != 0) text += ", ENSD: " + std::to_string(n.ensd);
    text += n.rng == "nv" ? ", RNG: NV" : ", RNG: CPU";
    if (n.eta) {
        if (family == SamplerFamily::compvis && *n.eta != 0) text += ", Eta DDIM: " + format_number(*n.eta);
        if (family != SamplerFamily::compvis && *n.eta != 1) text += ", Eta: " + format_number(*n.eta);
    }
    if (n.brownian_tree != "a1111") text += ", Brownian tree: " + n.brownian_tree;
    return text;
}

// SDXL's size conditioning, where the flags made it other than the image's own
// (A1111's style: "Size"'s WxH, width first, a value with a comma quoted; A1111
// itself writes none of these).
std::string sdxl_size_text(const GenerateSettings& g) {
    std::string text;
    auto wxh = [](int w, int h) { return std::to_string(w) + "x" + std::to_string(h); };
    if (g.original_width || g.original_height) text += ", Original size: " + wxh(g.original_width, g.original_height);
    if (g.crop_top || g.crop_left)
        text += ", Crop coords: " + quoted(std::to_string(g.crop_top) + "," + std::to_string(g.crop_left));
    if (g.target_width || g.target_height) text += ", Target size: " + wxh(g.target_width, g.target_height);
    return text;
}

// A number short where that reads back the same, else with every digit (so --from-png remakes it).
std::string exact_number(double v) {
    std::string text = format_number(v);
    if (std::strtod(text.c_str(), nullptr) == v) return text;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

// The hires fix as A1111 writes it: its second pass's strength, the scale or
// the size, the steps where given, the upscaler.
std::string hires_text(const HiresFix& h) {
    if (!h.active()) return "";
    std::string text = ", Denoising strength: " + exact_number(h.strength);
    if (h.width > 0 || h.height > 0)
        text += ", Hires resize: " + std::to_string(h.width) + "x" + std::to_string(h.height);
    else
        text += ", Hires upscale: " + exact_number(h.scale);
    if (h.steps > 0) text += ", Hires steps: " + std::to_string(h.steps);
    return text + ", Hires upscaler: " + hires_upscaler_a1111_name(h.upscaler);
}

}  // namespace

std::string hires_upscaler_a1111_name(const std::string& upscaler) {
    if (upscaler == "latent-nearest") return "Latent (nearest)";
    if (upscaler == "lanczos") return "Lanczos";
    return "Latent";
}

std::string hires_upscaler_from_a1111(const std::string& a1111_name) {
    for (const char* ours : {"latent", "latent-nearest", "lanczos"})
        if (hires_upscaler_a1111_name(ours) == a1111_name) return ours;
    return "";
}

std::string parameters_text(const PromptItem& item, const PlannedImage& img, SeedMode mode, const std::string& model,
                            const std::vector<EmbeddingInfo>& embeddings, const std::string& model_hash) {
    // AUTOMATIC1111's sampler names, so that its "PNG info" reads them.
    const SamplerInfo& sampler = sampler_info(item.settings.sampler);
    // --lora's files are written as tags, as A1111 would have them, so that --from-png reruns them;
    // not in plain syntax, which reads tags as words (there --from-png needs --lora again).
    std::string text = item.prompt;
    for (const auto& l : item.settings.loras)
        if (!l.from_tag && item.settings.prompt_weights)
            text += " " + lora_tag_text(l.name, l.text_weight, l.unet_weight);
    text += "\n";
    if (!item.negative_prompt.empty()) text += "Negative prompt: " + item.negative_prompt + "\n";
    text += "Steps: " + std::to_string(item.settings.steps) + ", Sampler: " + sampler.a1111_name;
    // PLMS and DDIM: only a spacing other than CompVis's is named (A1111 writes none for them).
    if (sampler.family == SamplerFamily::k_diffusion || item.settings.schedule != "default")
        text += ", Schedule type: " + schedule_a1111_name(item.settings.schedule);
    text += ", CFG scale: " + format_number(item.settings.scale) + ", Seed: " + std::to_string(img.seed) +
            ", Size: " + std::to_string(item.settings.width) + "x" + std::to_string(item.settings.height) +
            (model_hash.empty() ? "" : ", Model hash: " + model_hash) + ", Model: " + quoted(model);
    text += variation_text(item.settings.noise);
    // AUTOMATIC1111's syntax is the default; the other reading changes the image, so it is recorded.
    if (!item.settings.prompt_weights) text += ", Prompt syntax: plain";
    // A1111 records clip skip when it is not 1, and the embeddings the prompts used.
    if (item.settings.clip_skip != 1) text += ", Clip skip: " + std::to_string(item.settings.clip_skip);
    text += sdxl_size_text(item.settings);
    if (const std::string ti = ti_hashes(item, embeddings); !ti.empty()) text += ", TI hashes: " + quoted(ti);
    if (!item.settings.loras.empty()) text += ", Lora hashes: " + lora_hashes_text(item.settings.loras);
    text += init_image_text(item.settings.init);
    text += noise_text(item.settings.noise, sampler.family);
    text += hires_text(item.settings.hires);
    text += std::string(", Seed mode: ") + seed_mode_name(mode) + ", Image index: " + std::to_string(img.index);
    // compvis: the run's seed alone does not say which noise this image got; its batch does.
    if (mode == SeedMode::compvis)
        text += ", Batch size: " + std::to_string(img.batch_size) +
                ", Batch position: " + std::to_string(img.position) +
                ", Batch number: " + std::to_string(img.batch_number);
    text += std::string(", Version: ") + kVersionName;
    return text;
}

RunPlan plan_run(const Txt2ImgJob& job) {
    if (job.n_samples < 1) throw Error("--n_samples must be at least 1");
    if (job.n_iter < 1) throw Error("--n_iter must be at least 1");
    if (job.prompts.empty()) throw Error("no prompt given (use --prompt or --from-file)");
    check_noise_settings(job.settings.noise);
    if (job.n_samples > kMaxImages) throw Error("--n_samples " + std::to_string(job.n_samples) + " is too large");
    const bool per_image = job.seed_mode == SeedMode::per_image;
    const bool sharded = job.shard.n != 1 || job.shard.k != 0;
    if (job.shard.n < 1 || job.shard.k < 0 || job.shard.k >= job.shard.n)
        throw Error("--shard K/N needs 0 <= K < N, got " + std::to_string(job.shard.k) + "/" +
                    std::to_string(job.shard.n));
    if (sharded && !per_image)
        throw Error("--shard needs --seed-mode per-image (with compvis seeds every image depends on all earlier ones)");
    if (sharded && !job.from_file) throw Error("--shard splits a prompt file: use it with --from-file");
    if (job.skip_existing && !per_image)
        throw Error(
            "--skip-existing needs --seed-mode per-image (with compvis seeds a resumed run cannot give the same "
            "images)");
    // --lora's files go into the PNG text as <lora:NAME:W> tags: a NAME holding the tag's syntax
    // would be read back by --from-png as another file and weight ("we:0.5" as "we" at 0.5).
    for (const auto& l : job.loras)
        if (l.name.find_first_of(":<>") != std::string::npos)
            throw Error("--lora " + l.path + ": its name \"" + l.name +
                        "\" holds ':', '<' or '>', which a <lora:NAME:WEIGHT> " +
                        "tag in the image's text cannot carry (it would be remade with another file); rename the file");
    // Resuming and sharding need names that depend only on the image: {index} unless told otherwise.
    std::string pattern = job.name_pattern;
    if (pattern.empty() && (job.skip_existing || sharded)) pattern = "{index}";
    if (!pattern.empty()) check_name_pattern(pattern);

    RunPlan plan;
    if (job.from_file) {
        for (size_t i = 0; i < job.prompts.size(); ++i)
            plan.items.push_back(resolve_item(job, job.prompts[i], static_cast<int>(i)));
    } else {
        // One prompt: a batch is n_samples copies of it (CompVis).
        for (int i = 0; i < job.n_samples; ++i) plan.items.push_back(resolve_item(job, job.prompts.front(), i));
    }

    // Batches: consecutive prompts with equal settings, at most n_samples; with
    // per-image seeds one image each (the pipeline draws a batch's noise from one generator).
    const size_t cap = per_image ? 1 : static_cast<size_t>(job.n_samples);
    std::vector<std::vector<int>> groups;
    for (int i = 0; i < static_cast<int>(plan.items.size()); ++i) {
        if (!groups.empty() && groups.back().size() < cap &&
            same_batch_settings(plan.items[groups.back().front()], plan.items[i]))
            groups.back().push_back(i);
        else
            groups.push_back({i});
    }
    // One .npy holds one array: all latents must have the same shape.
    if (!job.save_latents.empty())
        for (const auto& item : plan.items)
            if (item.settings.height != plan.items[0].settings.height ||
                item.settings.width != plan.items[0].settings.width)
                throw Error(item.where + ": --save-latents needs every image the same size; this line's size differs");
    int64_t total = 0;
    int max_iter = 0;
    for (const auto& g : groups) {
        total += static_cast<int64_t>(g.size()) * plan.items[g[0]].n_iter;
        max_iter = std::max(max_iter, plan.items[g[0]].n_iter);
    }
    if (total > kMaxImages)
        throw Error("the run would make " + std::to_string(total) + " images; the limit is " +
                    std::to_string(kMaxImages));

    // CompVis order: iterations outside, batches inside; a line with a smaller
    // n_iter of its own drops out of the later iterations.
    int index = job.first_index;
    for (int it = 0; it < max_iter; ++it) {
        for (const auto& g : groups) {
            if (plan.items[g[0]].n_iter <= it) continue;
            PlannedBatch batch;
            for (int item : g) {
                PlannedImage img;
                img.item = item;
                img.iteration = it;
                img.index = index++;
                img.batch_size = static_cast<int>(g.size());
                img.position = static_cast<int>(batch.images.size());
                img.batch_number = static_cast<int>(plan.batches.size());
                const auto& own = plan.items[item].seed;
                img.seed = !per_image ? job.seed
                           : own      ? *own + static_cast<uint64_t>(it)
                                      : job.seed + static_cast<uint64_t>(img.index);
                if (!pattern.empty()) img.name = expand_name(pattern, img.index, img.seed, plan.items[item].prompt);
                batch.images.push_back(std::move(img));
            }
            plan.batches.push_back(std::move(batch));
        }
    }

    if (!pattern.empty()) {
        std::map<std::string, int> seen;
        for (const auto& b : plan.batches)
            for (const auto& img : b.images) {
                if (img.name.size() > 255) throw Error("--name gives a file name longer than 255 bytes: " + img.name);
                auto [it, fresh] = seen.emplace(img.name, img.index);
                if (!fresh)
                    throw Error("--name \"" + pattern + "\" gives images " + std::to_string(it->second) + " and " +
                                std::to_string(img.index) + " the same name " + img.name + " (add {index})");
            }
    }
    return plan;
}

}  // namespace sd
