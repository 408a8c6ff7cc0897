// The model cache (include/sd/model_cache.h): sources, their hashes and index,
// the export arguments, entries, the lock, list and clear.
#include "sd/model_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/fs_util.h"
#include "io/json_depth.h"
#include "io/sha256.h"
#include "run/model_export.h"
#include "sd/error.h"
#include "sd/model_config.h"

namespace sd {

namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxIndexBytes = 16 << 20;
constexpr size_t kMaxIndexRows = 10000;
constexpr size_t kMaxSideFileBytes = 64 << 10;
constexpr size_t kMaxFolderFiles = 100000;
constexpr uint64_t kNoteHashingAbove = 256ull << 20;

void say(const ModelCacheOptions& o, const std::string& text) {
    if (o.note) o.note(text);
}

std::string gib(uint64_t bytes) {
    std::ostringstream s;
    s.precision(bytes >= (10ull << 30) ? 0 : 1);
    s << std::fixed << static_cast<double>(bytes) / (1ull << 30) << " GiB";
    return s.str();
}

// What the index knows a source by: its real path, size and newest mtime. For a
// folder, size and mtime are the total and the newest of the files under it.
struct Fingerprint {
    std::string path;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    bool folder = false;
};

int64_t mtime_ns(const struct stat& st) {
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// The regular files under a folder (links followed), relative names in order.
std::vector<std::string> folder_files(const std::string& dir) {
    std::vector<std::string> files;
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        if (it.depth() > 8) it.disable_recursion_pending();
        if (it->is_regular_file(ec)) files.push_back(fs::relative(it->path(), dir, ec).string());
        if (files.size() > kMaxFolderFiles) throw Error(dir + " holds more than 100000 files: not a diffusers folder");
    }
    if (ec) throw Error("cannot read " + dir + ": " + ec.message());
    std::sort(files.begin(), files.end());
    return files;
}

Fingerprint fingerprint(const std::string& path) {
    Fingerprint f;
    std::error_code ec;
    f.path = fs::canonical(path, ec).string();
    if (ec) throw Error(path + " cannot be read: " + ec.message());
    struct stat st;
    if (::stat(f.path.c_str(), &st) != 0) throw Error(path + " cannot be read: " + std::strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        f.size = static_cast<uint64_t>(st.st_size);
        f.mtime_ns = mtime_ns(st);
        return f;
    }
    f.folder = true;
    for (const auto& name : folder_files(f.path)) {
        if (::stat(join_path(f.path, name).c_str(), &st) != 0) continue;
        f.size += static_cast<uint64_t>(st.st_size);
        f.mtime_ns = std::max(f.mtime_ns, mtime_ns(st));
    }
    return f;
}

// A file's SHA-256; a folder's is that of its files' names and SHA-256s, in order.
std::string content_sha256(const Fingerprint& f) {
    if (!f.folder) return sha256_file_hex(f.path);
    std::string listing;
    for (const auto& name : folder_files(f.path))
        listing += name + '\0' + sha256_file_hex(join_path(f.path, name)) + '\n';
    return sha256_hex(listing);
}

// flock on a file of the cache; released when destroyed (or when the process dies).
class FileLock {
public:
    explicit FileLock(const std::string& path) {
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) throw Error("cannot create the lock " + path + ": " + std::strerror(errno));
    }
    ~FileLock() { ::close(fd_); }
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;
    bool try_lock() { return ::flock(fd_, LOCK_EX | LOCK_NB) == 0; }
    void lock() {
        while (::flock(fd_, LOCK_EX) != 0)
            if (errno != EINTR) throw Error(std::string("cannot lock the model cache: ") + std::strerror(errno));
    }

private:
    int fd_ = -1;
};

// CACHE/index.tsv: "sha256 TAB size TAB mtime_ns TAB path" a line. A cache, not
// a source of truth: a line that does not read is skipped (and the file hashed).
struct IndexRow {
    std::string sha256;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    std::string path;
};

bool is_hex(const std::string& s, size_t n) {
    return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::vector<IndexRow> read_index(const std::string& cache) {
    std::vector<IndexRow> rows;
    const std::string path = join_path(cache, "index.tsv");
    if (!file_exists(path)) return rows;
    std::string text;
    try {
        text = read_file_capped(path, kMaxIndexBytes, "model cache index");
    } catch (const Error&) {
        return rows;  // rebuilt as sources are hashed again
    }
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        IndexRow r;
        std::string size, mtime;
        if (!std::getline(fields, r.sha256, '\t') || !std::getline(fields, size, '\t') ||
            !std::getline(fields, mtime, '\t') || !std::getline(fields, r.path) || !is_hex(r.sha256, 64))
            continue;
        try {
            r.size = std::stoull(size);
            r.mtime_ns = std::stoll(mtime);
        } catch (const std::exception&) {
            continue;
        }
        rows.push_back(r);
    }
    return rows;
}

std::string known_sha256(const std::vector<IndexRow>& rows, const Fingerprint& f) {
    for (const auto& r : rows)
        if (r.path == f.path && r.size == f.size && r.mtime_ns == f.mtime_ns) return r.sha256;
    return "";
}

void remember_sha256(const std::string& cache, const Fingerprint& f, const std::string& sha) {
    if (f.path.find_first_of("\t\n") != std::string::npos) return;  // such a path is hashed every time
    FileLock lock(join_path(cache, "index.lock"));
    lock.lock();
    auto rows = read_index(cache);
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const IndexRow& r) { return r.path == f.path; }),
               rows.end());
    rows.push_back({sha, f.size, f.mtime_ns, f.path});
    if (rows.size() > kMaxIndexRows) rows.erase(rows.begin(), rows.end() - kMaxIndexRows);
    std::string text;
    for (const auto& r : rows)
        text += r.sha256 + '\t' + std::to_string(r.size) + '\t' + std::to_string(r.mtime_ns) + '\t' + r.path + '\n';
    write_file_atomic(join_path(cache, "index.tsv"), text.data(), text.size());
}

// The SHA-256 of a file or folder: from the index when its path, size and mtime
// are the ones recorded, else read (once) and recorded.
std::string source_sha256(const std::string& cache, const std::string& path, const ModelCacheOptions& o) {
    const Fingerprint f = fingerprint(path);
    if (std::string sha = known_sha256(read_index(cache), f); !sha.empty()) return sha;
    if (f.size > kNoteHashingAbove)
        say(o, "hashing " + path + " (" + gib(f.size) + "; once, later runs know it by its size and time)");
    const std::string sha = content_sha256(f);
    remember_sha256(cache, f, sha);
    return sha;
}

// The export flags that take a path: in the side file, relative to its folder.
bool takes_path(const std::string& key) {
    return key == "config" || key == "text-config" || key == "text-config-2" || key == "tokenizer" || key == "vae" ||
           key == "lora";
}

void check_export_arg(const std::string& arg, const std::string& where) {
    for (const char* own : {"--out", "--random-init"})
        if (arg == own || arg.rfind(std::string(own) + "=", 0) == 0)
            throw Error(where + ": " + own + " is the cache's to set, not an export argument to give");
}

// SOURCE_NAME.export.json beside the source: a JSON object of export flags
// without their dashes, e.g. {"config": "v1-inference.yaml", "dtype": "float16",
// "lora": ["a.safetensors:0.5"]}; true for a flag without a value.
std::vector<std::string> side_file_args(const std::string& side) {
    std::vector<std::string> args;
    const std::string text = read_file_capped(side, kMaxSideFileBytes, "export side file");
    nlohmann::json j;
    try {
        j = parse_json_limited(text, side + ": nested too deeply");
    } catch (const nlohmann::json::exception& e) {
        throw Error(side + ": not valid JSON (" + std::string(e.what()).substr(0, 200) + ")");
    }
    if (!j.is_object())
        throw Error(side + ": must be a JSON object of export flags, e.g. {\"config\": \"v1-inference.yaml\"}");
    const std::string dir = fs::path(side).parent_path().string();
    for (const auto& item : j.items()) {
        // Named, not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
        const std::string& raw_key = item.key();
        const auto& value = item.value();
        std::string key = raw_key;
        std::replace(key.begin(), key.end(), '_', '-');
        if (key.empty() || key.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos)
            throw Error(side + ": \"" + raw_key + "\" is not an export flag name");
        const std::string flag = "--" + key;
        check_export_arg(flag, side);
        auto add = [&](const nlohmann::json& v) {
            std::string s;
            if (v.is_string())
                s = v.get<std::string>();
            else if (v.is_number())
                s = v.dump();
            else
                throw Error(side + ": \"" + raw_key + "\" must be a string, a number, true or a list of strings");
            if (takes_path(key) && !s.empty() && s[0] != '/' && !dir.empty()) s = join_path(dir, s);
            args.push_back(flag);
            args.push_back(s);
        };
        if (value.is_boolean()) {
            if (value.get<bool>()) args.push_back(flag);
        } else if (value.is_array()) {
            for (const auto& v : value) add(v);
        } else {
            add(value);
        }
    }
    return args;
}

// The side file of a source: its name without extension (a folder: its name) + ".export.json".
std::string side_file_of(const std::string& source) {
    fs::path p = fs::path(source).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return (p.parent_path() / (p.stem().string() + ".export.json")).string();
}

// The export arguments' share of the entry's name: their text, each file they
// name by its content (through the index), so that an edited config is a new entry.
std::string args_key(const std::string& cache, const std::vector<std::string>& args, const ModelCacheOptions& o) {
    if (args.empty()) return "";
    auto is_file = [](const std::string& p) {
        struct stat st;
        return !p.empty() && ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    };
    std::string text;
    for (const auto& a : args) {
        std::string part = a;
        const size_t colon = a.find_last_of(':');
        if (is_file(a))
            part = "file " + source_sha256(cache, a, o);
        else if (colon != std::string::npos && is_file(a.substr(0, colon)))  // FILE:WEIGHT
            part = "file " + source_sha256(cache, a.substr(0, colon), o) + a.substr(colon);
        text += part + '\0';
    }
    return sha256_hex(text).substr(0, 8);
}

std::string entry_name(const std::string& sha, const std::string& key) {
    return sha.substr(0, 16) + "-" + std::to_string(kModelExportVersion) + (key.empty() ? "" : "-" + key);
}

bool is_entry_name(const std::string& name) {
    static const std::regex re("[0-9a-f]{16}-[0-9]+(-[0-9a-f]{8})?");
    return std::regex_match(name, re);
}

// ENTRY/cache.json's source_sha256, or "" when the entry is missing or not one of ours.
std::string entry_sha256(const std::string& entry) {
    const std::string meta = join_path(entry, "cache.json");
    if (!file_exists(join_path(entry, "model.json")) || !file_exists(meta)) return "";
    try {
        const auto j = parse_json_limited(read_file_capped(meta, kMaxSideFileBytes, "cache entry"), "too deep");
        if (!j.is_object() || j.value("export_version", 0) != kModelExportVersion) return "";
        const std::string sha = j.value("source_sha256", "");
        return is_hex(sha, 64) ? sha : "";
    } catch (const std::exception&) {
        return "";
    }
}

// Takes a folder out of the cache at once (a rename), then deletes it.
uint64_t discard(const std::string& path) {
    const std::string trash = path + ".trash-" + std::to_string(::getpid());
    std::error_code ec;
    fs::rename(path, trash, ec);
    if (ec) return 0;
    uint64_t bytes = 0;
    for (fs::recursive_directory_iterator it(trash, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) bytes += it->file_size(ec);
    fs::remove_all(trash, ec);
    return bytes;
}

// The leftovers of interrupted exports of one entry (ENTRY.tmp-PID, ENTRY.trash-PID).
int remove_leftovers(const std::string& cache, const std::string& name, uint64_t* bytes) {
    int removed = 0;
    std::error_code ec;
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(cache, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(name + ".tmp-", 0) == 0 || n.rfind(name + ".trash-", 0) == 0) found.push_back(e.path().string());
    }
    for (const auto& p : found) {
        const uint64_t b = discard(p);
        if (bytes) *bytes += b;
        ++removed;
    }
    return removed;
}

ResolvedModel export_into_cache(const std::string& cache, const std::string& source, const std::string& sha,
                                const std::vector<std::string>& args, const std::string& entry,
                                const ModelCacheOptions& o) {
    ResolvedModel r;
    r.dir = entry;
    FileLock lock(entry + ".lock");
    if (!lock.try_lock()) {
        say(o, "waiting for another sd-txt2img that is exporting " + source + " into the model cache");
        lock.lock();
    }
    if (entry_sha256(entry) == sha) return r;  // the other process made it
    std::error_code ec;
    if (fs::exists(entry, ec)) discard(entry);  // incomplete or not ours: made again
    const std::string name = fs::path(entry).filename().string();
    remove_leftovers(cache, name, nullptr);  // we hold the lock: whoever wrote them is gone

    const std::string tmp = entry + ".tmp-" + std::to_string(::getpid());
    fs::create_directory(tmp, ec);
    if (ec) throw Error("cannot create " + tmp + " in the model cache: " + ec.message());
    say(o, "exporting " + source + " into the model cache " + entry + " (once; later runs start from it)");
    try {
        std::error_code abs_ec;
        run_python_export(fs::absolute(source, abs_ec).string(), tmp, args, o.note, source);
        const ModelConfig cfg = load_model_config(tmp);
        if (!cfg.source_sha256.empty() && cfg.source_sha256 != sha)
            throw Error(source + " changed while it was being exported; run again");
        nlohmann::json meta = {{"source_sha256", sha}, {"export_version", kModelExportVersion}, {"export_args", args}};
        const std::string text = meta.dump(1) + "\n";
        write_file_atomic(join_path(tmp, "cache.json"), text.data(), text.size());
        fs::rename(tmp, entry, ec);
        if (ec) throw Error("cannot move the export into place as " + entry + ": " + ec.message());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    say(o, "cached " + source + " as " + entry);
    return r;
}

bool is_gguf(const std::string& path) {
    std::string ext = fs::path(path).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    return ext == ".gguf";
}

bool has_checkpoint_extension(const std::string& path) {
    std::string ext = fs::path(path).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    return ext == ".safetensors" || ext == ".sft" || ext == ".ckpt" || ext == ".pt" || ext == ".pth" || is_gguf(path);
}

}  // namespace

std::string default_model_cache_dir() {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') return join_path(xdg, "sd-txt2img/models");  // the spec ignores a relative one
    const char* home = std::getenv("HOME");
    if (home && *home) return join_path(home, ".cache/sd-txt2img/models");
    throw Error("no folder for the model cache: HOME and XDG_CACHE_HOME are unset; give --model-cache DIR");
}

ResolvedModel resolve_model(const std::string& model, const ModelCacheOptions& options) {
    ResolvedModel r;
    r.dir = model;
    struct stat st;
    if (::stat(model.c_str(), &st) != 0) {
        if (errno == ENOENT) throw Error("--model " + model + " does not exist");
        throw Error("--model " + model + " cannot be read: " + std::strerror(errno));
    }
    fs::path name_path = fs::path(model).lexically_normal();
    if (name_path.filename().empty()) name_path = name_path.parent_path();
    if (S_ISDIR(st.st_mode)) {
        // An exported folder runs as it is; so does one that is not diffusers either (its load says what is missing).
        if (file_exists(join_path(model, "model.json")) || !file_exists(join_path(model, "model_index.json"))) return r;
    } else if (!S_ISREG(st.st_mode) || !has_checkpoint_extension(model)) {
        throw Error("--model " + model +
                    " is not a model: give an exported folder (model.json), a checkpoint (.safetensors, .ckpt, "
                    ".gguf) or a diffusers folder (model_index.json)");
    }
    const std::string cache = options.cache_dir.empty() ? default_model_cache_dir() : options.cache_dir;
    std::error_code ec;
    fs::create_directories(cache, ec);
    if (ec || !is_directory(cache)) throw Error("cannot use " + cache + " as the model cache: " + ec.message());

    std::vector<std::string> args;
    const std::string side = side_file_of(model);
    if (file_exists(side)) args = side_file_args(side);
    for (const auto& a : options.export_args) check_export_arg(a, "--export-arg");
    args.insert(args.end(), options.export_args.begin(), options.export_args.end());
    // A quantized GGUF's UNet stays 8-bit in the cache (0.9 GiB for SD 1.5, not 3.3) unless a --dtype is given.
    const bool dtype_given = std::any_of(
        args.begin(), args.end(), [](const std::string& a) { return a == "--dtype" || a.rfind("--dtype=", 0) == 0; });
    if (is_gguf(model) && !dtype_given) args.insert(args.end(), {"--dtype", "auto"});

    const std::string sha = source_sha256(cache, model, options);
    const std::string entry = join_path(cache, entry_name(sha, args_key(cache, args, options)));
    if (entry_sha256(entry) != sha) r = export_into_cache(cache, model, sha, args, entry, options);
    r.dir = entry;
    r.name = S_ISDIR(st.st_mode) ? name_path.filename().string() : name_path.stem().string();
    return r;
}

std::vector<ModelCacheEntry> list_model_cache(const std::string& cache_dir) {
    std::vector<ModelCacheEntry> out;
    if (!is_directory(cache_dir)) return out;
    const auto rows = read_index(cache_dir);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(cache_dir, ec)) {
        const std::string name = e.path().filename().string();
        if (!is_entry_name(name)) continue;
        ModelCacheEntry m;
        m.path = e.path().string();
        m.source_sha256 = entry_sha256(m.path);
        if (m.source_sha256.empty()) continue;  // not complete
        try {
            m.source_name = load_model_config(m.path).source;
        } catch (const Error&) {}
        for (const auto& row : rows)
            if (row.sha256 == m.source_sha256) m.sources.push_back(row.path);
        for (fs::recursive_directory_iterator it(m.path, ec), end; !ec && it != end; it.increment(ec))
            if (it->is_regular_file(ec)) m.bytes += it->file_size(ec);
        out.push_back(m);
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
    return out;
}

ModelCacheCleared clear_model_cache(const std::string& cache_dir) {
    ModelCacheCleared c;
    if (!is_directory(cache_dir)) return c;
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(cache_dir, ec)) {
        const std::string n = e.path().filename().string();
        if (is_entry_name(n)) names.push_back(n);
        // Leftovers whose entry never completed.
        const size_t dot = n.find('.');
        if (dot != std::string::npos && is_entry_name(n.substr(0, dot)) &&
            (n.compare(dot, 5, ".tmp-") == 0 || n.compare(dot, 7, ".trash-") == 0 || n.compare(dot, 5, ".lock") == 0))
            names.push_back(n.substr(0, dot));
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    for (const auto& name : names) {
        const std::string entry = join_path(cache_dir, name);
        // The lock files stay: one removed while another process waits on it would let a third in beside it.
        FileLock lock(entry + ".lock");
        if (!lock.try_lock()) {
            ++c.busy;
            continue;
        }
        c.partial += remove_leftovers(cache_dir, name, &c.bytes);
        if (fs::exists(entry, ec)) {
            c.bytes += discard(entry);
            ++c.entries;
        }
    }
    FileLock lock(join_path(cache_dir, "index.lock"));
    lock.lock();
    fs::remove(join_path(cache_dir, "index.tsv"), ec);
    std::vector<fs::path> index_temps;  // of a run killed while it wrote the index
    for (const auto& e : fs::directory_iterator(cache_dir, ec))
        if (e.path().filename().string().rfind("index.tsv.tmp-", 0) == 0) index_temps.push_back(e.path());
    for (const auto& p : index_temps) fs::remove(p, ec);
    return c;
}

}  // namespace sd
