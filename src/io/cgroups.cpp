#include "io/cgroups.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "io/fs_util.h"

namespace sd {

namespace {

// Decimal digits with nothing but blanks (and newlines) around them.
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

// The directories that govern the process for `controller`, its own cgroup's first,
// each with whether it is v2's. v1 mounts a controller at root/<controllers as
// /proc/self/cgroup lists them> (cpu,cpuacct) or root/<controller>; v2 at root.
// A path that is not under its mount (a container that sees its own cgroup as
// the root) is read at the mount alone.
void for_each_cgroup(const std::string& cgroups, const std::string& root, const std::string& controller,
                     const std::function<void(const std::string& dir, bool v2)>& visit) {
    std::istringstream in(cgroups);
    std::string line;
    while (std::getline(in, line)) {
        // "hierarchy-id:controllers:path"; v2's is "0::path".
        const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos || b + 1 >= line.size() || line[b + 1] != '/') continue;
        const std::string controllers = line.substr(a + 1, b - a - 1);
        std::string path = line.substr(b + 1), base;
        if (controllers.empty()) {
            base = root;
        } else {
            std::istringstream names(controllers);
            std::string name;
            bool listed = false;
            while (std::getline(names, name, ',')) listed = listed || name == controller;
            if (!listed) continue;
            base = is_directory(root + "/" + controllers) ? root + "/" + controllers : root + "/" + controller;
        }
        if (!is_directory(base)) continue;
        while (path.size() > 1 && path.back() == '/') path.pop_back();
        if (path.find("/..") != std::string::npos || !is_directory(base + path)) path = "/";
        for (;;) {
            visit(path == "/" ? base : base + path, controllers.empty());
            if (path == "/") break;
            const size_t slash = path.rfind('/');
            path = slash == 0 ? "/" : path.substr(0, slash);
        }
    }
}

// v1 writes "no limit" as the largest page count in bytes (2^63 less a page).
constexpr double kNoMemoryLimit = 1e18;

std::optional<double> memory_room_in(const std::string& dir, bool v2) {
    std::optional<double> limit;
    for (const char* name : v2 ? std::vector<const char*>{"memory.max", "memory.high"}
                               : std::vector<const char*>{"memory.limit_in_bytes"}) {
        const auto v = number(read_kernel_text(dir + "/" + name));  // "max" (v2) is no number
        if (v && *v < kNoMemoryLimit) limit = std::min(limit.value_or(*v), *v);
    }
    if (!limit) return std::nullopt;
    const auto usage = number(read_kernel_text(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes")));
    if (!usage) return std::nullopt;
    // The page cache counted in the usage is reclaimed before the kernel kills;
    // v1's hierarchical totals come first.
    const std::string stat = read_kernel_text(dir + "/memory.stat");
    const double cache = stat_value(stat, {"total_active_file", "active_file"}).value_or(0) +
                         stat_value(stat, {"total_inactive_file", "inactive_file"}).value_or(0);
    return std::max(0.0, *limit - *usage + std::min(cache, *usage));
}

std::optional<double> cpu_quota_in(const std::string& dir, bool v2) {
    if (v2) {  // cpu.max: "QUOTA PERIOD" or "max PERIOD"
        const std::string text = read_kernel_text(dir + "/cpu.max");
        const size_t space = text.find(' ');
        if (space == std::string::npos) return std::nullopt;
        const auto quota = number(text.substr(0, space)), period = number(text.substr(space + 1));
        if (!quota || !period || *period <= 0) return std::nullopt;
        return *quota / *period;
    }
    const auto quota = number(read_kernel_text(dir + "/cpu.cfs_quota_us"));  // -1: none (no number)
    const auto period = number(read_kernel_text(dir + "/cpu.cfs_period_us"));
    if (!quota || !period || *period <= 0) return std::nullopt;
    return *quota / *period;
}

std::optional<double> least(const std::string& cgroups, const std::string& root, const std::string& controller,
                            std::optional<double> (*in_dir)(const std::string&, bool)) {
    std::optional<double> least;
    for_each_cgroup(cgroups, root, controller, [&](const std::string& dir, bool v2) {
        if (const auto v = in_dir(dir, v2)) least = std::min(least.value_or(*v), *v);
    });
    return least;
}

}  // namespace

std::optional<double> cgroup_memory_room(const std::string& cgroups, const std::string& root) {
    return least(cgroups, root, "memory", memory_room_in);
}

std::optional<double> cgroup_cpu_quota(const std::string& cgroups, const std::string& root) {
    return least(cgroups, root, "cpu", cpu_quota_in);
}

int usable_cpus(int affinity_cpus, std::optional<double> quota) {
    int n = std::max(1, affinity_cpus);
    if (quota) n = std::min(n, static_cast<int>(std::max(1.0, std::ceil(*quota - 1e-9))));
    return n;
}

int usable_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int affinity = sched_getaffinity(0, sizeof set, &set) == 0
                             ? CPU_COUNT(&set)
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return usable_cpus(affinity, cgroup_cpu_quota(read_kernel_text("/proc/self/cgroup"), "/sys/fs/cgroup"));
}

}  // namespace sd
