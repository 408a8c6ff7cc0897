// --manifest's path: a file of our JSON lines, never an image or anything else.
#include <filesystem>
#include <fstream>

#include "io/fs_util.h"
#include "io/json_depth.h"
#include "sd/error.h"
#include "sd/model_hash.h"

namespace sd {

namespace {

namespace fs = std::filesystem;

// The first line of a file (at most 64 KiB of it: a record is far shorter).
std::string first_line(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string text(64 * 1024, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    const size_t nl = text.find('\n');
    return nl == std::string::npos ? text : text.substr(0, nl);
}

bool is_manifest_record(const std::string& line) {
    try {
        const nlohmann::json j = parse_json_limited(line, "too deep");
        return j.is_object() && j.contains("index") && j.contains("path") && j.contains("status");
    } catch (const std::exception&) {
        return false;
    }
}

fs::path folder_of(const fs::path& p) {
    std::error_code ec;
    const fs::path dir = fs::weakly_canonical(fs::absolute(p, ec), ec);
    return ec ? p : dir;
}

}  // namespace

void check_manifest_path(const std::string& manifest, const std::string& outdir) {
    const fs::path path(manifest);
    const std::string name = path.filename().string();
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".png") == 0) {
        // Images are .png files in the output folder (previews in its previews folder): a
        // manifest there could take an image's name, and a resumed run would skip that image.
        const fs::path dir = folder_of(path.parent_path().empty() ? fs::path(".") : path.parent_path());
        const fs::path out = folder_of(outdir);
        if (dir == out || dir == out / "previews")
            throw Error("--manifest " + manifest + " is a name the run's images take in --outdir " + outdir +
                        "; give the manifest its own name (e.g. manifest.jsonl)");
    }
    if (!file_exists(manifest)) return;
    if (check_regular_file(manifest, "--manifest") == 0) return;
    if (!is_manifest_record(first_line(manifest)))
        throw Error("--manifest " + manifest +
                    " is a file but not a manifest (its first line is not one of this "
                    "tool's JSON records); it is never appended to: give a new name");
}

bool manifest_has_records(const std::string& manifest) {
    std::error_code ec;
    return fs::is_regular_file(manifest, ec) && fs::file_size(manifest, ec) > 0 && !ec;
}

}  // namespace sd
