#include "sd/dry_run.h"

#include <map>

#include <nlohmann/json.hpp>

#include "run/batch_plan.h"
#include "sd/from_png.h"

namespace sd {

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json noise_json(const NoiseSettings& n) {
    ordered_json j;
    j["rng"] = n.rng;
    j["ensd"] = n.ensd;
    j["subseed"] = n.subseed ? ordered_json(*n.subseed) : ordered_json(nullptr);
    j["subseed_strength"] = n.subseed_strength;
    j["seed_resize_from"] =
        n.seed_resize_from_w > 0 && n.seed_resize_from_h > 0
            ? ordered_json(std::to_string(n.seed_resize_from_w) + "x" + std::to_string(n.seed_resize_from_h))
            : ordered_json(nullptr);
    j["brownian_tree"] = n.brownian_tree;
    j["eta"] = n.eta ? ordered_json(*n.eta) : ordered_json(nullptr);
    return j;
}

ordered_json init_json(const InitImage& init) {
    if (!init.active()) return nullptr;
    ordered_json j;
    j["path"] = init.path;
    j["mask"] = init.mask.empty() ? ordered_json(nullptr) : ordered_json(init.mask);
    j["strength"] = init.strength;
    j["mask_blur"] = init.mask_blur;
    j["invert_mask"] = init.invert_mask;
    j["outpaint"] = init.outpaint;
    j["resize_mode"] = init.resize_mode;
    j["masked_content"] = init.masked_content;
    return j;
}

// The hashes the run would record: each LoRA's short hash, each picture's SHA-256.
void fill_hashes(RunPlan& plan, const std::vector<LoraUse>& used) {
    std::map<std::string, std::string> sha;
    auto sha_of = [&](const std::string& path, const char* flag) {
        auto it = sha.find(path);
        return it != sha.end() ? it->second : sha.emplace(path, file_sha256(path, flag)).first->second;
    };
    for (auto& item : plan.items) {
        for (auto& l : item.settings.loras)
            for (const auto& u : used)
                if (u.path == l.path) l.hash = u.hash;
        InitImage& init = item.settings.init;
        if (!init.active()) continue;
        init.image_hash = sha_of(init.path, "--init-img");
        if (!init.mask.empty()) init.mask_hash = sha_of(init.mask, "--mask");
    }
}

}  // namespace

std::vector<std::string> dry_run_records(const Txt2ImgJob& job) {
    RunPlan plan = plan_run(job);
    fill_hashes(plan, check_job_loras(job));
    std::vector<std::string> lines;
    for (const auto& batch : plan.batches)
        for (const auto& img : batch.images) {
            const PromptItem& item = plan.items[img.item];
            if (item.number % job.shard.n != job.shard.k) continue;
            if (job.keep_position && img.position != *job.keep_position) continue;
            const GenerateSettings& s = item.settings;
            ordered_json j;
            j["index"] = img.index;
            j["prompt"] = item.prompt;
            j["negative_prompt"] = item.negative_prompt;
            j["seed"] = img.seed;
            j["seed_mode"] = seed_mode_name(job.seed_mode);
            j["batch"] = {{"size", img.batch_size}, {"position", img.position}, {"number", img.batch_number}};
            j["sampler"] = s.sampler;
            j["schedule"] = s.schedule;
            j["steps"] = s.steps;
            j["scale"] = s.scale;
            j["width"] = s.width;
            j["height"] = s.height;
            j["clip_skip"] = s.clip_skip;
            j["prompt_syntax"] = s.prompt_weights ? "a1111" : "plain";
            j["noise"] = noise_json(s.noise);
            j["loras"] = ordered_json::array();
            for (const auto& l : s.loras)
                j["loras"].push_back(
                    {{"path", l.path}, {"text_weight", l.text_weight}, {"unet_weight", l.unet_weight}});
            j["init"] = init_json(s.init);
            j["parameters"] = parameters_text(item, img, job.seed_mode, job.model_name, {}, job.model_hash);
            lines.push_back(j.dump(-1, ' ', false, ordered_json::error_handler_t::replace));
        }
    return lines;
}

}  // namespace sd
