// The budget a run takes without --max-memory (memory/memory_budget.h): the
// machine's MemAvailable, the room of the process's memory cgroup (on fake
// cgroup trees; test_cgroups.cpp reads them), and the memory the process
// already holds.
#include <gtest/gtest.h>

#include <string>

#include "memory/memory_budget.h"
#include "memory/planner.h"
#include "planner_models.h"
#include "test_util.h"

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double MiB = 1024.0 * 1024;

std::string bytes(double b) { return std::to_string(static_cast<long long>(b)) + "\n"; }

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
    sdtest::write_files(s.cgroup_root + "/job", {{"memory.max", bytes(5 * GiB)}, {"memory.current", bytes(4.5 * GiB)}});
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
    EXPECT_GE(b.bytes, *held);  // what it holds, and what the machine or its cgroup can still give
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
    sdtest::write_files(s.cgroup_root + "/job", {{"memory.max", bytes(8 * GiB)}, {"memory.current", bytes(GiB)}});
    s.cgroups = "0::/job\n";
    EXPECT_EQ(sd::max_memory_over_cgroup(8 * GiB, s), "");
    const std::string w = sd::max_memory_over_cgroup(12 * GiB, s);
    EXPECT_EQ(w, "--max-memory 12.00 GiB is more than this process's memory cgroup lets it hold (8.00 GiB): the "
                 "kernel kills the process at that limit, whatever the plan");
}
