#include "memory/memory_budget.h"

#include <sstream>

#include "io/cgroups.h"
#include "io/fs_util.h"
#include "sd/memory_plan.h"

namespace sd {

MemorySources this_process_memory() {
    MemorySources s;
    s.meminfo = read_kernel_text("/proc/meminfo");
    s.status = read_kernel_text("/proc/self/status");
    s.cgroups = read_kernel_text("/proc/self/cgroup");
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

MemoryBudget memory_budget(const MemorySources& s) {
    const double machine = kib_field(s.meminfo, "MemAvailable").value_or(4.0 * 1024 * 1024 * 1024);
    const auto cgroup = cgroup_memory_room(s.cgroups, s.cgroup_root);
    MemoryBudget b;
    b.from_cgroup = cgroup && *cgroup < machine;
    b.bytes = (b.from_cgroup ? *cgroup : machine) + kib_field(s.status, "RssAnon").value_or(0);
    return b;
}

std::string max_memory_over_cgroup(double max_memory, const MemorySources& s) {
    const auto room = cgroup_memory_room(s.cgroups, s.cgroup_root);
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
