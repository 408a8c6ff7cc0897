#include "sd/loras.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "io/lora_keys.h"
#include "io/printable.h"
#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

namespace {

// A1111's \w in a tag's type: ASCII letters, digits and '_', and (roughly) any non-ASCII letter.
bool is_word_byte(char c) {
    const auto u = static_cast<unsigned char>(c);
    return std::isalnum(u) || u == '_' || u >= 0x80;
}

// Calls f(begin, end, type) for every extra-network tag as A1111's prompt parser finds them
// (modules/extra_networks.py: "<" type ":" args ">", type one or more word characters, args
// one or more characters other than '>'), left to right.
template <class F>
void each_network_tag(const std::string& prompt, F f) {
    size_t at = 0;
    while ((at = prompt.find('<', at)) != std::string::npos) {
        size_t colon = at + 1;
        while (colon < prompt.size() && is_word_byte(prompt[colon])) ++colon;
        const size_t end = colon < prompt.size() && prompt[colon] == ':' ? prompt.find('>', colon + 1) : at;
        if (end == std::string::npos) return;  // no '>' after this '<', nor after any later one
        if (colon == at + 1 || end <= colon + 1) {
            ++at;
            continue;
        }
        f(at, end + 1, prompt.substr(at + 1, colon - at - 1));
        at = end + 1;
    }
}

// "lyco" is the same tag as "lora" in A1111 (the old LyCORIS extension's name for it).
bool is_lora_type(const std::string& type) { return type == "lora" || type == "lyco"; }

// Calls f(begin, end) for every "<lora:...>" and "<lyco:...>" tag.
template <class F>
void each_tag(const std::string& prompt, F f) {
    each_network_tag(prompt, [&](size_t b, size_t e, const std::string& type) {
        if (is_lora_type(type)) f(b, e);
    });
}

std::vector<std::string> split_colons(const std::string& s) {
    std::vector<std::string> out(1);
    for (char c : s) {
        if (c == ':')
            out.emplace_back();
        else
            out.back() += c;
    }
    return out;
}

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// LoRA multipliers in use lie within about -2..2 (A1111's slider stops at 2);
// |w| = 100 already turns any trained LoRA into noise, and larger values reach
// fp16/fp32 overflow in the merged weights (1e30, or 1e300, which is no float
// at all). Refused where they are written, not after sampling.
constexpr double kMaxLoraWeight = 100;

// "" when t is a usable weight, else why not.
std::string weight_problem(const std::string& t, double* value) {
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0') return "is not a number";
    if (std::isnan(v)) return "is not a number (NaN)";
    if (!std::isfinite(v) || std::fabs(v) > kMaxLoraWeight)
        return "is outside -" + number_text(kMaxLoraWeight) + " .. " + number_text(kMaxLoraWeight);
    *value = v;
    return "";
}

double weight_of(const std::string& text, const std::string& tag, const std::string& where) {
    const std::string t = trim(text);
    double v = 0;
    if (const std::string why = weight_problem(t, &v); !why.empty())
        throw Error(where + ": " + printable(tag) + ": the LoRA weight '" + printable(t) + "' " + why +
                    " (a number such as 0.8)");
    return v;
}

// The .safetensors files below `dir` by name (without the extension), every subfolder
// walked once a run (symbolic links to folders are not followed: no loops).
const std::map<std::string, std::vector<std::string>>& lora_files_below(const std::string& dir) {
    static std::map<std::string, std::map<std::string, std::vector<std::string>>> walked;
    if (auto it = walked.find(dir); it != walked.end()) return it->second;
    auto& by_name = walked[dir];
    std::error_code ec;
    namespace fs = std::filesystem;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        const fs::path& p = it->path();
        if (p.extension() == ".safetensors" && it->is_regular_file(ec))
            by_name[p.stem().string()].push_back(p.string());
    }
    for (auto& [name, paths] : by_name) std::sort(paths.begin(), paths.end());
    return by_name;
}

// The same files by their alias: A1111 lists a LoRA under the name its trainer gave it
// (kohya's metadata "ss_output_name") as well as its file name, and a prompt copied from
// its pictures may use either. Read once a run, and only when a tag names no file; a
// file whose header cannot be read has no alias (it is refused if a tag names it).
const std::map<std::string, std::vector<std::string>>& lora_aliases_below(const std::string& dir) {
    static std::map<std::string, std::map<std::string, std::vector<std::string>>> read;
    if (auto it = read.find(dir); it != read.end()) return it->second;
    auto& by_alias = read[dir];
    for (const auto& [name, paths] : lora_files_below(dir)) {
        for (const auto& p : paths) {
            try {
                const auto meta = read_weight_metadata(p);
                const auto alias = meta.find("ss_output_name");
                if (alias != meta.end() && !alias->second.empty()) by_alias[alias->second].push_back(p);
            } catch (const Error&) {}
        }
    }
    for (auto& [alias, paths] : by_alias) std::sort(paths.begin(), paths.end());
    return by_alias;
}

Error several(const std::string& where, const std::string& name, const std::string& what,
              const std::vector<std::string>& paths, const std::string& dir) {
    return Error(where + ": <lora:" + printable(name) + "> " + what + " " + std::to_string(paths.size()) +
                 " files below " + printable(dir) + " (" + printable(paths[0]) + ", " + printable(paths[1]) +
                 (paths.size() > 2 ? ", ..." : "") + "); keep one, or give it with --lora");
}

// A tag's file: DIR/NAME.safetensors, else the one NAME.safetensors in DIR's subfolders
// (A1111 finds a LoRA by its name anywhere below its LoRA folder), else the one file
// below DIR whose alias is NAME; the first path when there is none, for the caller's
// "does not exist".
std::string tag_file(const std::string& dir, const std::string& name, const std::string& where) {
    const std::string direct = (dir.back() == '/' ? dir : dir + "/") + name + ".safetensors";
    std::error_code ec;
    if (std::filesystem::exists(direct, ec)) return direct;
    const auto& below = lora_files_below(dir);
    if (const auto it = below.find(name); it != below.end()) {
        if (it->second.size() > 1) throw several(where, name, "matches", it->second, dir);
        return it->second[0];
    }
    const auto& aliases = lora_aliases_below(dir);
    const auto it = aliases.find(name);
    if (it == aliases.end()) return direct;
    if (it->second.size() > 1) throw several(where, name, "is the alias (ss_output_name) of", it->second, dir);
    return it->second[0];
}

}  // namespace

std::vector<LoraTag> find_lora_tags(const std::string& prompt, const std::string& where) {
    std::vector<LoraTag> tags;
    each_tag(prompt, [&](size_t b, size_t e) {
        const std::string tag = prompt.substr(b, e - b);
        const auto parts = split_colons(tag.substr(6, tag.size() - 7));  // after "<lora:" or "<lyco:"
        LoraTag t;
        t.name = trim(parts[0]);
        if (t.name.empty() || t.name.find('/') != std::string::npos)
            throw Error(where + ": " + tag + " does not name a LoRA file (<lora:NAME:WEIGHT>, NAME without '/')");
        bool unet_given = false;
        std::vector<std::string> positional;
        for (size_t i = 1; i < parts.size(); ++i) {
            const std::string p = trim(parts[i]);
            if (p.rfind("te=", 0) == 0) {
                t.text_weight = weight_of(p.substr(3), tag, where);
            } else if (p.rfind("unet=", 0) == 0) {
                t.unet_weight = weight_of(p.substr(5), tag, where);
                unet_given = true;
            } else {
                positional.push_back(p);
            }
        }
        if (positional.size() > 2) throw Error(where + ": " + tag + " has more than two weights (<lora:NAME:TE:UNET>)");
        if (!positional.empty()) t.text_weight = weight_of(positional[0], tag, where);
        if (positional.size() == 2)
            t.unet_weight = weight_of(positional[1], tag, where);
        else if (!unet_given)
            t.unet_weight = t.text_weight;  // one weight: both parts
        tags.push_back(t);
    });
    return tags;
}

std::string strip_network_tags(const std::string& prompt) {
    std::string out;
    size_t from = 0;
    each_network_tag(prompt, [&](size_t b, size_t e, const std::string&) {
        out += prompt.substr(from, b - from);
        from = e;
    });
    return out + prompt.substr(from);
}

std::vector<std::string> unapplied_network_tags(const std::string& prompt) {
    std::vector<std::string> out;
    each_network_tag(prompt, [&](size_t b, size_t e, const std::string& type) {
        if (!is_lora_type(type)) out.push_back(prompt.substr(b, e - b));
    });
    return out;
}

LoraUse parse_lora_flag(const std::string& text) {
    LoraUse use;
    use.path = text;
    const size_t colon = text.find_last_of(':');
    if (colon != std::string::npos) {
        const std::string w = text.substr(colon + 1);
        char* end = nullptr;
        std::strtod(w.c_str(), &end);
        double v = 0;
        const std::string why = weight_problem(w, &v);
        if (why.empty()) {
            use.path = text.substr(0, colon);
            use.text_weight = use.unet_weight = v;
        } else if (!w.empty() && *end == '\0') {
            // A number that is no usable weight ("f:nan", "f:1e300"), not part of a file name
            // (a file really named "f:nan" is given as "f:nan:1").
            throw Error("--lora " + printable(text) + ": the weight '" + printable(w) + "' " + why +
                        " (--lora FILE[:WEIGHT])");
        }
    }
    if (use.path.empty()) throw Error("--lora '" + text + "' names no file (--lora FILE[:WEIGHT])");
    std::string name =
        use.path.substr(use.path.find_last_of('/') == std::string::npos ? 0 : use.path.find_last_of('/') + 1);
    const size_t dot = name.find_last_of('.');
    if (dot != std::string::npos && dot > 0) name.erase(dot);
    use.name = name;
    use.where = "--lora";
    return use;
}

std::string lora_tag_text(const std::string& name, double text_weight, double unet_weight) {
    std::string t = "<lora:" + name + ":" + number_text(text_weight);
    if (unet_weight != text_weight) t += ":" + number_text(unet_weight);
    return t + ">";
}

std::vector<LoraUse> prompt_loras(const std::string& prompt, const std::string& where, const std::string& lora_dir,
                                  const std::vector<LoraUse>& flag_loras) {
    std::vector<LoraUse> loras;
    for (const auto& tag : find_lora_tags(prompt, where)) {
        if (lora_dir.empty())
            throw Error(where + ": <lora:" + tag.name + "> needs --lora-dir, the folder that holds " + tag.name +
                        ".safetensors");
        LoraUse use;
        use.path = tag_file(lora_dir, tag.name, where);
        use.name = tag.name;
        use.text_weight = tag.text_weight;
        use.unet_weight = tag.unet_weight;
        use.from_tag = true;
        use.where = where;
        loras.push_back(use);
    }
    loras.insert(loras.end(), flag_loras.begin(), flag_loras.end());
    return loras;
}

void hash_lora_files(std::vector<LoraUse>& loras, std::map<std::string, std::string>& cache) {
    for (auto& l : loras) {
        auto it = cache.find(l.path);
        if (it == cache.end()) {
            try {  // refuses a missing file, a folder, a FIFO or a device, and a corrupt header
                it = cache.emplace(l.path, lora_short_hash(l.path)).first;
            } catch (const Error& e) {
                if (!l.from_tag) throw;
                throw Error(l.where + ": " + e.what() + " (named by the prompt's <lora:" + l.name + "> tag)");
            }
        }
        l.hash = it->second;
    }
}

std::string lora_hashes_text(const std::vector<LoraUse>& loras) {
    std::string list;
    for (const auto& l : loras) list += (list.empty() ? "" : ", ") + l.name + ": " + l.hash;
    return nlohmann::json(list).dump();
}

}  // namespace sd
