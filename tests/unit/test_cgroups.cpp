// What the process's cgroups allow it (io/cgroups.h), on fake cgroup trees of
// both versions: the memory room, the CPU quota, and the CPUs a default
// --threads takes.
#include <gtest/gtest.h>
#include <sched.h>

#include <string>

#include "io/cgroups.h"
#include "test_util.h"

using sdtest::write_files;

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double MiB = 1024.0 * 1024;

std::string bytes(double b) { return std::to_string(static_cast<long long>(b)) + "\n"; }

}  // namespace

TEST(CgroupMemory, V2TakesTheTightestLimitOnTheWayUp) {
    const std::string root = sdtest::temp_dir();
    // The job's own cgroup sets no limit; its parent allows 3 GiB, of which 1 GiB is used,
    // 300 MiB of it file cache; the root (no interface files of its own) is skipped.
    write_files(root + "/job/step", {{"memory.max", "max\n"}, {"memory.current", bytes(GiB)}});
    write_files(root + "/job",
                {{"memory.max", bytes(3 * GiB)},
                 {"memory.high", "max\n"},
                 {"memory.current", bytes(GiB)},
                 {"memory.stat", "anon 700000000\nfile 314572800\nactive_file 104857600\ninactive_file 209715200\n"}});
    const auto room = sd::cgroup_memory_room("0::/job/step\n", root);
    ASSERT_TRUE(room);
    EXPECT_DOUBLE_EQ(*room, 2 * GiB + 300 * MiB);

    // memory.high below memory.max: the kernel throttles there, so the budget stops there.
    sdtest::write_text(root + "/job/memory.high", bytes(2 * GiB));
    EXPECT_DOUBLE_EQ(*sd::cgroup_memory_room("0::/job/step\n", root), GiB + 300 * MiB);

    // A tighter limit further down wins.
    sdtest::write_text(root + "/job/step/memory.max", bytes(1.5 * GiB));
    EXPECT_DOUBLE_EQ(*sd::cgroup_memory_room("0::/job/step\n", root), 0.5 * GiB);

    // Over the limit already: no room, never a negative one.
    sdtest::write_text(root + "/job/step/memory.current", bytes(4 * GiB));
    EXPECT_DOUBLE_EQ(*sd::cgroup_memory_room("0::/job/step\n", root), 0.0);
}

TEST(CgroupMemory, V1ReadsTheMemoryHierarchy) {
    const std::string root = sdtest::temp_dir();
    // v1 writes "no limit" as 2^63 less a page; the hierarchical totals come first in memory.stat.
    write_files(root + "/memory/slurm/job_7",
                {{"memory.limit_in_bytes", "9223372036854771712\n"}, {"memory.usage_in_bytes", bytes(GiB)}});
    write_files(root + "/memory/slurm",
                {{"memory.limit_in_bytes", bytes(8 * GiB)},
                 {"memory.usage_in_bytes", bytes(3 * GiB)},
                 {"memory.stat", "cache 5\nactive_file 1\ninactive_file 1\ntotal_active_file " + bytes(GiB) +
                                     "total_inactive_file " + bytes(GiB)}});
    const std::string cgroups = "12:pids:/slurm/job_7\n4:cpu,memory:/slurm/job_7\n0::/slurm/job_7\n";
    const auto room = sd::cgroup_memory_room(cgroups, root);
    ASSERT_TRUE(room);
    EXPECT_DOUBLE_EQ(*room, 7 * GiB);
}

TEST(CgroupMemory, APathOutsideTheMountIsReadAtTheMountItself) {
    // A container without its own cgroup namespace sees the host's path in /proc/self/cgroup
    // but its own cgroup mounted at the root.
    const std::string root = sdtest::temp_dir();
    write_files(root, {{"memory.max", bytes(2 * GiB)}, {"memory.current", bytes(GiB / 2)}});
    EXPECT_DOUBLE_EQ(*sd::cgroup_memory_room("0::/docker/0123abcd\n", root), 1.5 * GiB);
    EXPECT_DOUBLE_EQ(*sd::cgroup_memory_room("0::/../../elsewhere\n", root), 1.5 * GiB);
}

TEST(CgroupMemory, NoLimitAndDamagedFilesGiveNoRoom) {
    const std::string root = sdtest::temp_dir();
    EXPECT_FALSE(sd::cgroup_memory_room("", root));
    EXPECT_FALSE(sd::cgroup_memory_room("0::/\n", root + "/absent"));
    write_files(root + "/a", {{"memory.max", "max\n"}, {"memory.current", bytes(GiB)}});
    EXPECT_FALSE(sd::cgroup_memory_room("0::/a\n", root));
    for (const char* bad : {"", "-5\n", "12abc\n", "0x100\n", " \n"}) {
        write_files(root + "/a", {{"memory.max", bad}, {"memory.current", bytes(GiB)}});
        EXPECT_FALSE(sd::cgroup_memory_room("0::/a\n", root)) << "memory.max " << bad;
    }
    // A limit whose usage cannot be read is no room at all.
    write_files(root + "/a", {{"memory.max", bytes(2 * GiB)}, {"memory.current", "many\n"}});
    EXPECT_FALSE(sd::cgroup_memory_room("0::/a\n", root));
    for (const char* line : {"garbage\n", "0:\n", "::\n", "4:memory:relative\n", "0::\n"})
        EXPECT_FALSE(sd::cgroup_memory_room(line, root)) << line;
}

TEST(CgroupCpu, V2QuotaIsTheTightestOnTheWayUp) {
    const std::string root = sdtest::temp_dir();
    write_files(root + "/job/step", {{"cpu.max", "max 100000\n"}});
    write_files(root + "/job", {{"cpu.max", "150000 100000\n"}});
    EXPECT_DOUBLE_EQ(*sd::cgroup_cpu_quota("0::/job/step\n", root), 1.5);
    sdtest::write_text(root + "/job/step/cpu.max", "50000 100000\n");
    EXPECT_DOUBLE_EQ(*sd::cgroup_cpu_quota("0::/job/step\n", root), 0.5);
    for (const char* bad : {"max 100000\n", "100000\n", "100000 0\n", "a b\n", ""}) {
        write_files(root + "/job", {{"cpu.max", bad}});
        write_files(root + "/job/step", {{"cpu.max", bad}});
        EXPECT_FALSE(sd::cgroup_cpu_quota("0::/job/step\n", root)) << bad;
    }
}

TEST(CgroupCpu, V1QuotaUnderTheControllersMount) {
    const std::string root = sdtest::temp_dir();
    // Mounted as the controllers /proc/self/cgroup lists (cpu,cpuacct); -1: no quota.
    write_files(root + "/cpu,cpuacct/docker/abc", {{"cpu.cfs_quota_us", "200000\n"}, {"cpu.cfs_period_us", "100000\n"}});
    write_files(root + "/cpu,cpuacct/docker", {{"cpu.cfs_quota_us", "-1\n"}, {"cpu.cfs_period_us", "100000\n"}});
    EXPECT_DOUBLE_EQ(*sd::cgroup_cpu_quota("3:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n", root), 2.0);
    EXPECT_FALSE(sd::cgroup_cpu_quota("4:memory:/docker/abc\n", root));  // no cpu controller listed
    // Mounted under the controller's own name.
    write_files(root + "/cpu/job", {{"cpu.cfs_quota_us", "250000\n"}, {"cpu.cfs_period_us", "100000\n"}});
    EXPECT_DOUBLE_EQ(*sd::cgroup_cpu_quota("2:cpu:/job\n", root), 2.5);
}

TEST(UsableCpus, AffinityCappedByTheQuotaRoundedUp) {
    EXPECT_EQ(sd::usable_cpus(64, std::nullopt), 64);
    EXPECT_EQ(sd::usable_cpus(64, 2.0), 2);
    EXPECT_EQ(sd::usable_cpus(64, 1.5), 2);
    EXPECT_EQ(sd::usable_cpus(64, 0.2), 1);
    EXPECT_EQ(sd::usable_cpus(2, 8.0), 2);
    EXPECT_EQ(sd::usable_cpus(0, std::nullopt), 1);
}

TEST(UsableCpus, FollowsThisThreadsAffinityMask) {
    cpu_set_t before;
    ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
        if (CPU_ISSET(c, &before)) first = c;
    ASSERT_GE(first, 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    const int cpus = sd::usable_cpus();
    ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
    EXPECT_EQ(cpus, 1);
    EXPECT_LE(sd::usable_cpus(), CPU_COUNT(&before));
}
