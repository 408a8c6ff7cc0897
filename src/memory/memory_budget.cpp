#include "memory/memory_budget.h"

#include "sd/memory_plan.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace sd {

namespace {

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

bool is_dir(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Decimal digits alone on their line (cgroup files end in a newline).
std::optional<double> number(const std::string& text) {
    const size_t begin = text.find_first_not_of(" \t");
    if (begin == std::string::npos) return std::nullopt;
    const size_t end = text.find_first_not_of("0123456789", begin);
    if (end == begin || (end != std::string::npos && text.find_first_not_of(" \t\n", end) != std::string::npos))
        return std::nullopt;
    return std::strtod(text.c_str() + begin, nullptr);
}

// "key value" lines (memory.stat); the first of `keys` present.
std::optional<double> stat_value(const std::string& text, const std::vector<const char*>& keys) {
    for (const char* key : keys) {
        std::istringstream in(text);
        std::string line;
        while (std::getline(in, line)) {
            const size_t space = line.find(' ');
            if (space != std::string::npos && line.compare(0, space, key) == 0) return number(line.substr(space + 1));
        }
    }
    return std::nullopt;
}

// v1 writes "no limit" as the largest page count in bytes (2^63 less a page).
constexpr double kNoLimit = 1e18;

struct CgroupFiles {
    std::vector<const char*> limits;  // the least of these that is a number
    const char* usage;
    std::vector<const char*> active, inactive;  // memory.stat keys, hierarchical first
};

const CgroupFiles kV2{{"memory.max", "memory.high"}, "memory.current", {"active_file"}, {"inactive_file"}};
const CgroupFiles kV1{{"memory.limit_in_bytes"},
                      "memory.usage_in_bytes",
                      {"total_active_file", "active_file"},
                      {"total_inactive_file", "inactive_file"}};

// The room in one cgroup directory, or none where it sets no limit.
std::optional<double> room_in(const std::string& dir, const CgroupFiles& f) {
    std::optional<double> limit;
    for (const char* name : f.limits) {
        const auto v = number(read_text(dir + "/" + name));  // "max" (v2) is no number
        if (v && *v < kNoLimit) limit = std::min(limit.value_or(*v), *v);
    }
    if (!limit) return std::nullopt;
    const auto usage = number(read_text(dir + "/" + f.usage));
    if (!usage) return std::nullopt;
    // The page cache counted in the usage is reclaimed before the kernel kills.
    const std::string stat = read_text(dir + "/memory.stat");
    const double cache = stat_value(stat, f.active).value_or(0) + stat_value(stat, f.inactive).value_or(0);
    return std::max(0.0, *limit - *usage + std::min(cache, *usage));
}

// The least room from `path`'s cgroup up to the hierarchy's root at `base`. A path
// that is not under base (a container that sees its own cgroup as the root) is
// read at base alone.
std::optional<double> least_room(const std::string& base, std::string path, const CgroupFiles& f) {
    if (!is_dir(base)) return std::nullopt;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    if (path.find("/..") != std::string::npos || !is_dir(base + path)) path = "/";
    std::optional<double> least;
    for (;;) {
        const auto room = room_in(path == "/" ? base : base + path, f);
        if (room) least = std::min(least.value_or(*room), *room);
        if (path == "/" || path.empty()) break;
        const size_t slash = path.rfind('/');
        path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
    return least;
}

}  // namespace

MemorySources this_process_memory() {
    MemorySources s;
    s.meminfo = read_text("/proc/meminfo");
    s.status = read_text("/proc/self/status");
    s.cgroups = read_text("/proc/self/cgroup");
    return s;
}

std::optional<double> kib_field(const std::string& text, const std::string& key) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
        std::istringstream fields(line.substr(key.size() + 1));
        double kib = 0;
        std::string unit;
        if (fields >> kib >> unit && unit == "kB" && kib >= 0) return kib * 1024;
        return std::nullopt;
    }
    return std::nullopt;
}

std::optional<double> cgroup_room(const std::string& cgroups, const std::string& root) {
    std::optional<double> least;
    auto take = [&](const std::optional<double>& room) {
        if (room) least = std::min(least.value_or(*room), *room);
    };
    std::istringstream in(cgroups);
    std::string line;
    while (std::getline(in, line)) {
        // "hierarchy-id:controllers:path"; v2's is "0::path".
        const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos || b + 1 >= line.size() || line[b + 1] != '/') continue;
        const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (controllers.empty()) {
            take(least_room(root, path, kV2));
            continue;
        }
        std::istringstream names(controllers);
        std::string name;
        while (std::getline(names, name, ','))
            if (name == "memory") take(least_room(root + "/memory", path, kV1));
    }
    return least;
}

MemoryBudget memory_budget(const MemorySources& s) {
    const double machine = kib_field(s.meminfo, "MemAvailable").value_or(4.0 * 1024 * 1024 * 1024);
    const auto cgroup = cgroup_room(s.cgroups, s.cgroup_root);
    MemoryBudget b;
    b.from_cgroup = cgroup && *cgroup < machine;
    b.bytes = (b.from_cgroup ? *cgroup : machine) + kib_field(s.status, "RssAnon").value_or(0);
    return b;
}

std::string max_memory_over_cgroup(double max_memory, const MemorySources& s) {
    const auto room = cgroup_room(s.cgroups, s.cgroup_root);
    if (!room) return "";
    const double allowed = *room + kib_field(s.status, "RssAnon").value_or(0);
    if (max_memory <= allowed) return "";
    return "--max-memory " + format_size(max_memory) + " is more than this process's memory cgroup lets it hold (" +
           format_size(allowed) + "): the kernel kills the process at that limit, whatever the plan";
}

std::string max_memory_over_cgroup(double max_memory) {
    return max_memory_over_cgroup(max_memory, this_process_memory());
}

}  // namespace sd
