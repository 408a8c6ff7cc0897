#include "sd/records.h"

#include <nlohmann/json.hpp>

namespace sd {
namespace {

using ordered_json = nlohmann::ordered_json;

// Prompts are checked UTF-8, but a path or model name may not be: replace, never throw.
std::string line_of(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

}  // namespace

std::string image_record_json(const ImageRecord& r) {
    const PromptItem& item = *r.item;
    ordered_json j;
    j["path"] = r.path;
    j["prompt"] = item.prompt;
    j["negative_prompt"] = item.negative_prompt;
    j["seed"] = r.seed;
    j["seed_mode"] = seed_mode_name(r.seed_mode);
    j["index"] = r.index;
    j["line"] = item.line > 0 ? ordered_json(item.line) : ordered_json(nullptr);
    j["steps"] = item.settings.steps;
    j["sampler"] = item.settings.sampler;
    j["schedule"] = item.settings.schedule;
    j["scale"] = item.settings.scale;
    j["width"] = item.settings.width;
    j["height"] = item.settings.height;
    j["size"] = std::to_string(item.settings.width) + "x" + std::to_string(item.settings.height);
    j["model"] = r.model;
    j["seconds"] = static_cast<double>(static_cast<long long>(r.seconds * 1000 + 0.5)) / 1000;  // ms
    j["parameters"] = r.parameters;
    return line_of(j);
}

std::string grid_record_json(const std::string& path, const std::string& parameters, int images) {
    ordered_json j;
    j["path"] = path;
    j["grid"] = true;
    j["images"] = images;
    j["parameters"] = parameters;
    return line_of(j);
}

std::string manifest_record_json(const ImageRecord& r, const std::string& model_hash, const std::string& shard) {
    ordered_json m;
    m["index"] = r.index;
    m["prompt"] = r.item->prompt;
    m["seed"] = r.seed;
    m["parameters"] = r.parameters;
    m["model_hash"] = model_hash;
    m["path"] = r.path;
    m["status"] = "written";
    m["shard"] = shard;
    return line_of(m);
}

std::string token_ids_json(const std::vector<int64_t>& ids) { return nlohmann::json(ids).dump(); }

}  // namespace sd
