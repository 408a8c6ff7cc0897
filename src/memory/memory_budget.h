// The memory a run may hold when no --max-memory is given. The machine's
// MemAvailable is not enough on its own:
// - in a container, a Slurm job or a systemd unit, the process's memory cgroup
//   may allow far less than the machine has free, and the kernel kills the
//   process at the cgroup's limit;
// - a later batch of the same run is planned with the weights and kept blocks
//   of the first already resident. MemAvailable has dropped by them while the
//   plan counts them again, so the second prompt of a file would be refused.
// So the budget is what the machine and the cgroup can give now, plus the
// anonymous memory the process already holds.
#pragma once
#include <optional>
#include <string>

namespace sd {

// The texts the budget is read from; this_process_memory() reads the real ones.
struct MemorySources {
    std::string meminfo;                         // /proc/meminfo
    std::string status;                          // /proc/self/status
    std::string cgroups;                         // /proc/self/cgroup
    std::string cgroup_root = "/sys/fs/cgroup";  // where the cgroup file systems are mounted
};

MemorySources this_process_memory();

// Bytes of a "Key: N kB" line of /proc/meminfo or /proc/self/status.
std::optional<double> kib_field(const std::string& text, const std::string& key);

struct MemoryBudget {
    double bytes = 0;
    bool from_cgroup = false;  // the cgroup's room was less than the machine's
};

// The least of the machine's MemAvailable and the memory cgroup's room
// (io/cgroups.h), plus the process's RssAnon.
MemoryBudget memory_budget(const MemorySources& s);

// sd/memory_plan.h's max_memory_over_cgroup, from these sources.
std::string max_memory_over_cgroup(double max_memory, const MemorySources& s);

}  // namespace sd
