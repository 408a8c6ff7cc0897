// What the process's control groups allow it: a container, a Slurm job or a
// systemd unit may give it less memory and fewer CPUs than the machine has.
// Read from the text of /proc/self/cgroup and the cgroup file systems mounted
// at `root` (/sys/fs/cgroup), v1 or v2; the tightest cgroup from the process's
// own up to the hierarchy's root wins.
#pragma once
#include <optional>
#include <string>

namespace sd {

// Bytes the process may still take: limit - usage + the file cache the kernel
// would reclaim first. None where no cgroup on the way has a limit.
std::optional<double> cgroup_memory_room(const std::string& cgroups, const std::string& root);

// CPUs' worth of time per period the process may use (cpu.max, or v1's
// cfs_quota_us / cfs_period_us): 1.5 for `docker --cpus 1.5`. None where unlimited.
std::optional<double> cgroup_cpu_quota(const std::string& cgroups, const std::string& root);

// CPUs the process may run on: those of its affinity mask (taskset, a Slurm job's
// cpuset), at most its cgroup's CPU quota rounded up; at least 1.
int usable_cpus(int affinity_cpus, std::optional<double> quota);
int usable_cpus();  // for this process, from the real files

}  // namespace sd
