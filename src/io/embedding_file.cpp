#include "io/embedding_file.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "io/printable.h"
#include "io/sha256.h"
#include "sd/error.h"

namespace sd {
namespace {

namespace fs = std::filesystem;

std::string extension_of(const std::string& path) {
    std::string ext = fs::path(path).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return ext;
}

bool is_a1111_key(const std::string& name) {
    return name == "emb_params" || name == "string_to_param.*" || name == "clip_l";
}

// A1111's SDXL embeddings: exactly these two tensors.
bool is_sdxl_pair(const std::vector<std::string>& names) {
    return names.size() == 2 && std::find(names.begin(), names.end(), "clip_l") != names.end() &&
           std::find(names.begin(), names.end(), "clip_g") != names.end();
}

}  // namespace

bool is_embedding_file_name(const std::string& path) {
    const std::string ext = extension_of(path);
    return ext == ".safetensors" || ext == ".pt" || ext == ".bin";
}

std::vector<std::string> embedding_files(const std::vector<std::string>& files, const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& f : files) {
        if (!fs::exists(f, ec)) throw Error("--embedding " + f + ": no such file");
        if (fs::is_directory(f, ec))
            throw Error("--embedding " + f + " is a folder (use --embeddings-dir for a folder)");
        out.push_back(f);
    }
    if (dir.empty()) return out;
    if (!fs::exists(dir, ec)) throw Error("--embeddings-dir " + dir + ": no such folder");
    if (!fs::is_directory(dir, ec)) throw Error("--embeddings-dir " + dir + " is not a folder");
    std::vector<std::string> found;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
    if (ec) throw Error("--embeddings-dir " + dir + ": cannot read it (" + ec.message() + ")");
    for (; it != end; it.increment(ec)) {
        if (ec) throw Error("--embeddings-dir " + dir + ": cannot read it (" + ec.message() + ")");
        if (it->is_regular_file(ec) && is_embedding_file_name(it->path().string()))
            found.push_back(it->path().string());
    }
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
    return out;
}

std::string embedding_tensor_name(const std::vector<std::string>& names, const std::string& path) {
    for (const char* key : {"emb_params", "string_to_param.*"})
        if (std::find(names.begin(), names.end(), key) != names.end()) return key;
    if (names.size() == 1) return names[0];
    if (names.empty()) throw Error("embedding " + path + " holds no tensor");
    if (is_sdxl_pair(names))
        throw Error("embedding " + path + " is an SDXL embedding (clip_l and clip_g); this model is SD 1.x or 2.x");
    std::string list;
    for (size_t k = 0; k < names.size() && k < 4; ++k) list += (k ? ", " : "") + printable(names[k], 64);
    if (names.size() > 4) list += ", ...";
    throw Error("embedding " + path + " holds " + std::to_string(names.size()) + " tensors (" + list +
                ") and none is emb_params or string_to_param.*: not a textual-inversion embedding of one text encoder");
}

std::vector<std::string> sdxl_embedding_tensor_names(const std::vector<std::string>& names, const std::string& path) {
    if (is_sdxl_pair(names)) return {"clip_l", "clip_g"};
    if (names.empty()) throw Error("embedding " + path + " holds no tensor");
    throw Error("embedding " + path + " is not an SDXL embedding (no clip_l and clip_g tensors; " +
                (names.size() == 1 ? "one tensor " + printable(names[0], 64) + ": an SD 1.x or 2.x embedding?)"
                                   : std::to_string(names.size()) + " other tensors)"));
}

std::string embedding_trigger(const std::string& path, const std::string& tensor_name) {
    if (!is_a1111_key(tensor_name)) return tensor_name;
    return fs::path(path).stem().string();
}

bool same_ignoring_case(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k)
        if (std::tolower(static_cast<unsigned char>(a[k])) != std::tolower(static_cast<unsigned char>(b[k])))
            return false;
    return true;
}

void check_trigger_word(const std::string& trigger, const std::string& what) {
    const auto refuse = [&](const std::string& why) {
        throw Error(what + ": its trigger word \"" + printable(trigger, 64) + "\" " + why +
                    "; rename the file (A1111 files) or its key (diffusers files)");
    };
    if (trigger.empty()) refuse("is empty");
    if (trigger.size() > 256) refuse("is longer than 256 bytes");
    if (trigger == "BREAK") refuse("is the prompt keyword BREAK");
    if (trigger.size() == 1) refuse("is a single character, which would replace it in every prompt");
    for (char c : trigger) {
        const auto u = static_cast<unsigned char>(c);
        if (u <= ' ' || u == 0x7f) refuse("holds whitespace or a control character");
        if (std::string_view("()[]:\\").find(c) != std::string_view::npos)
            refuse(std::string("holds '") + c + "', a character of the prompt syntax");
    }
}

std::string embedding_short_hash(const std::string& path) { return sha256_file_hex(path).substr(0, 10); }

}  // namespace sd
