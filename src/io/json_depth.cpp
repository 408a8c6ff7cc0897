#include "io/json_depth.h"

#include "sd/error.h"

namespace sd {

nlohmann::json parse_json_limited(const std::string& text, const std::string& too_deep) {
    using json = nlohmann::json;
    // depth: how many arrays and objects enclose the one that starts.
    const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json&) {
        if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
            depth >= kMaxJsonDepth)
            throw Error(too_deep);
        return true;
    };
    return json::parse(text, check);
}

}  // namespace sd
