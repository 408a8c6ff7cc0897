// The budget a run takes without --max-memory (memory/memory_budget.h): the
// machine's MemAvailable, the room of the process's memory cgroup (v1 and v2,
// on fake cgroup trees), and the memory the process already holds.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "memory/memory_budget.h"
#include "memory/planner.h"
#include "planner_models.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double MiB = 1024.0 * 1024;

std::string bytes(double b) { return std::to_string(static_cast<long long>(b)) + "\n"; }

// Writes `files` (name -> text) into root/dir.
void cgroup_dir(const std::string& root, const std::string& dir,
                const std::vector<std::pair<std::string, std::string>>& files) {
    const fs::path d = fs::path(root) / dir;
    fs::create_directories(d);
    for (const auto& [name, text] : files) sdtest::write_text((d / name).string(), text);
}

std::string meminfo(double available) {
    return "MemTotal:       24683772 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
           std::to_string(static_cast<long long>(available / 1024)) + " kB\n";
}

std::string status(double anon) {
    return "Name:\tsd-txt2img\nVmRSS:\t  9999999 kB\nRssAnon:\t  " + std::to_string(static_cast<long long>(anon / 1024)) +
           " kB\nRssFile:\t  1234 kB\n";
}

}  // namespace

TEST(MemoryBudget, ReadsKibFields) {
    EXPECT_DOUBLE_EQ(*sd::kib_field(meminfo(3 * GiB), "MemAvailable"), 3 * GiB);
    EXPECT_DOUBLE_EQ(*sd::kib_field(status(512 * MiB), "RssAnon"), 512 * MiB);
    EXPECT_FALSE(sd::kib_field(meminfo(GiB), "MemAvail"));  // a prefix is not the key
    EXPECT_FALSE(sd::kib_field("MemAvailable: lots kB\n", "MemAvailable"));
    EXPECT_FALSE(sd::kib_field("MemAvailable: 5 pages\n", "MemAvailable"));
    EXPECT_FALSE(sd::kib_field("", "MemAvailable"));
}

TEST(MemoryBudget, CgroupV2TakesTheTightestLimitOnTheWayUp) {
    const std::string root = sdtest::temp_dir();
    // The job's own cgroup sets no limit; its parent allows 3 GiB, of which 1 GiB is used,
    // 300 MiB of it file cache; the root (no interface files of its own) is skipped.
    cgroup_dir(root, "job/step", {{"memory.max", "max\n"}, {"memory.current", bytes(GiB)}});
    cgroup_dir(root, "job",
               {{"memory.max", bytes(3 * GiB)},
                {"memory.high", "max\n"},
                {"memory.current", bytes(GiB)},
                {"memory.stat", "anon 700000000\nfile 314572800\nactive_file 104857600\ninactive_file 209715200\n"}});
    const auto room = sd::cgroup_room("0::/job/step\n", root);
    ASSERT_TRUE(room);
    EXPECT_DOUBLE_EQ(*room, 2 * GiB + 300 * MiB);

    // memory.high below memory.max: the kernel throttles there, so the budget stops there.
    sdtest::write_text(root + "/job/memory.high", bytes(2 * GiB));
    EXPECT_DOUBLE_EQ(*sd::cgroup_room("0::/job/step\n", root), GiB + 300 * MiB);

    // A tighter limit further down wins.
    sdtest::write_text(root + "/job/step/memory.max", bytes(1.5 * GiB));
    EXPECT_DOUBLE_EQ(*sd::cgroup_room("0::/job/step\n", root), 0.5 * GiB);

    // Over the limit already: no room, never a negative one.
    sdtest::write_text(root + "/job/step/memory.current", bytes(4 * GiB));
    EXPECT_DOUBLE_EQ(*sd::cgroup_room("0::/job/step\n", root), 0.0);
}

TEST(MemoryBudget, CgroupV1ReadsTheMemoryHierarchy) {
    const std::string root = sdtest::temp_dir();
    // v1 writes "no limit" as 2^63 less a page; the hierarchical totals come first in memory.stat.
    cgroup_dir(root, "memory/slurm/job_7",
               {{"memory.limit_in_bytes", "9223372036854771712\n"}, {"memory.usage_in_bytes", bytes(GiB)}});
    cgroup_dir(root, "memory/slurm",
               {{"memory.limit_in_bytes", bytes(8 * GiB)},
                {"memory.usage_in_bytes", bytes(3 * GiB)},
                {"memory.stat", "cache 5\nactive_file 1\ninactive_file 1\ntotal_active_file " + bytes(GiB) +
                                    "total_inactive_file " + bytes(GiB)}});
    const std::string cgroups = "12:pids:/slurm/job_7\n4:cpu,memory:/slurm/job_7\n0::/slurm/job_7\n";
    const auto room = sd::cgroup_room(cgroups, root);
    ASSERT_TRUE(room);
    EXPECT_DOUBLE_EQ(*room, 7 * GiB);
}

TEST(MemoryBudget, ACgroupPathOutsideTheMountIsReadAtTheMountItself) {
    // A container without its own cgroup namespace sees the host's path in /proc/self/cgroup
    // but its own cgroup mounted at the root.
    const std::string root = sdtest::temp_dir();
    cgroup_dir(root, "", {{"memory.max", bytes(2 * GiB)}, {"memory.current", bytes(GiB / 2)}});
    EXPECT_DOUBLE_EQ(*sd::cgroup_room("0::/docker/0123abcd\n", root), 1.5 * GiB);
    EXPECT_DOUBLE_EQ(*sd::cgroup_room("0::/../../elsewhere\n", root), 1.5 * GiB);
}

TEST(MemoryBudget, NoLimitAndDamagedFilesGiveNoRoom) {
    const std::string root = sdtest::temp_dir();
    EXPECT_FALSE(sd::cgroup_room("", root));
    EXPECT_FALSE(sd::cgroup_room("0::/\n", root + "/absent"));
    cgroup_dir(root, "a", {{"memory.max", "max\n"}, {"memory.current", bytes(GiB)}});
    EXPECT_FALSE(sd::cgroup_room("0::/a\n", root));
    for (const char* bad : {"", "-5\n", "12abc\n", "0x100\n", " \n"}) {
        cgroup_dir(root, "a", {{"memory.max", bad}, {"memory.current", bytes(GiB)}});
        EXPECT_FALSE(sd::cgroup_room("0::/a\n", root)) << "memory.max " << bad;
    }
    // A limit whose usage cannot be read is no room at all.
    cgroup_dir(root, "a", {{"memory.max", bytes(2 * GiB)}, {"memory.current", "many\n"}});
    EXPECT_FALSE(sd::cgroup_room("0::/a\n", root));
    for (const char* line : {"garbage\n", "0:\n", "::\n", "4:memory:relative\n", "0::\n"})
        EXPECT_FALSE(sd::cgroup_room(line, root)) << line;
}

TEST(MemoryBudget, WhatTheProcessHoldsIsCountedBackIn) {
    // A later batch is planned with the first's weights resident: the machine has 1 GiB
    // left, the process holds 4 GiB, and the plan counts those 4 GiB again.
    sd::MemorySources s;
    s.meminfo = meminfo(GiB);
    s.status = status(4 * GiB);
    s.cgroup_root = sdtest::temp_dir();
    sd::MemoryBudget b = sd::memory_budget(s);
    EXPECT_DOUBLE_EQ(b.bytes, 5 * GiB);
    EXPECT_FALSE(b.from_cgroup);

    // A cgroup that leaves less than the machine sets the budget, and says so.
    cgroup_dir(s.cgroup_root, "job", {{"memory.max", bytes(5 * GiB)}, {"memory.current", bytes(4.5 * GiB)}});
    s.cgroups = "0::/job\n";
    b = sd::memory_budget(s);
    EXPECT_DOUBLE_EQ(b.bytes, 4.5 * GiB);
    EXPECT_TRUE(b.from_cgroup);

    // A cgroup with more room than the machine has leaves the machine's figure.
    sdtest::write_text(s.cgroup_root + "/job/memory.max", bytes(64 * GiB));
    b = sd::memory_budget(s);
    EXPECT_DOUBLE_EQ(b.bytes, 5 * GiB);
    EXPECT_FALSE(b.from_cgroup);
}

TEST(MemoryBudget, ThisProcessHasABudget) {
    const sd::MemoryBudget b = sd::memory_budget(sd::this_process_memory());
    const auto held = sd::kib_field(sd::this_process_memory().status, "RssAnon");
    ASSERT_TRUE(held) << "/proc/self/status has no RssAnon";
    EXPECT_GT(b.bytes, *held);
}

TEST(MemoryBudget, PlansNameTheCgroupThatSetTheirBudget) {
    sd::MemoryRequest r;
    r.height = r.width = 512;
    r.budget = 64 * GiB;
    r.budget_from_cgroup = true;
    const sd::MemoryModel m = sdtest::sd15_memory_model();
    EXPECT_NE(sd::plan_memory(m, r, 0).describe().find("the memory cgroup's limit"), std::string::npos);
    r.budget = 100 * MiB;
    const std::string refusal = sdtest::error_of([&] { sd::plan_memory(m, r, 0); });
    EXPECT_NE(refusal.find("not enough memory: the budget is 100 MiB (what the process's memory cgroup allows)"),
              std::string::npos)
        << refusal;
    // A larger --max-memory would only move the kill: the limit is the job's.
    EXPECT_NE(refusal.find("; give the job a memory limit of "), std::string::npos) << refusal;
    EXPECT_EQ(refusal.find("--max-memory"), std::string::npos) << refusal;
    r.budget = 64 * GiB;
    r.budget_from_cgroup = false;
    EXPECT_EQ(sd::plan_memory(m, r, 0).describe().find("cgroup"), std::string::npos);
}

TEST(MemoryBudget, AMaxMemoryAboveTheCgroupsLimitIsWarnedAbout) {
    sd::MemorySources s;
    s.meminfo = meminfo(20 * GiB);
    s.status = status(GiB);
    s.cgroup_root = sdtest::temp_dir();
    EXPECT_EQ(sd::max_memory_over_cgroup(16 * GiB, s), "");  // no cgroup limit: the user's budget stands
    // A job limited to 8 GiB, 1 GiB of it this process's own memory: it may hold 8 GiB in all.
    cgroup_dir(s.cgroup_root, "job", {{"memory.max", bytes(8 * GiB)}, {"memory.current", bytes(GiB)}});
    s.cgroups = "0::/job\n";
    EXPECT_EQ(sd::max_memory_over_cgroup(8 * GiB, s), "");
    const std::string w = sd::max_memory_over_cgroup(12 * GiB, s);
    EXPECT_EQ(w, "--max-memory 12.00 GiB is more than this process's memory cgroup lets it hold (8.00 GiB): the "
                 "kernel kills the process at that limit, whatever the plan");
}
