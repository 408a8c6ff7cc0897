#include "prompts.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.h"
#include "fs_util.h"

namespace sd {

static bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<PromptLine> parse_prompts(const std::string& text, const std::string& name, bool jsonl) {
    std::vector<PromptLine> out;
    std::istringstream in(text);
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
        ++number;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const auto first = line.find_first_not_of(" \t");
        if (first == std::string::npos) continue;
        if (!jsonl && line[first] == '#') continue;
        const std::string where = name + ":" + std::to_string(number);
        if (jsonl) {
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const nlohmann::json::exception&) {
                throw Error(where + ": not valid JSON");
            }
            if (!j.is_object()) throw Error(where + ": expected a JSON object with \"prompt\"");
            auto it = j.find("prompt");
            if (it == j.end() || !it->is_string()) throw Error(where + ": missing string \"prompt\"");
            out.push_back({it->get<std::string>(), number});
        } else {
            out.push_back({line, number});
        }
    }
    if (out.empty()) throw Error("prompt file " + name + " holds no prompts");
    return out;
}

std::vector<PromptLine> read_prompt_file(const std::string& path) {
    std::stringstream ss;
    if (path == "-") {
        ss << std::cin.rdbuf();
    } else {
        std::ifstream in(path, std::ios::binary);
        if (!in || is_directory(path)) throw Error("cannot read prompt file " + path);
        ss << in.rdbuf();
        if (in.bad()) throw Error("cannot read prompt file " + path);
    }
    return parse_prompts(ss.str(), path == "-" ? "<stdin>" : path, ends_with(path, ".jsonl"));
}

}  // namespace sd
