// Running the CLI on a hostile input (issue 32's acceptance): it must end
// within a time limit (a hang counts as a failure: this catches hangs, it is
// not a speed test), be refused with exit 1 or 2 and one line on stderr that
// names the file, peak under a memory bound, and leave the output folder as
// it was.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace sdtest {

using BoundedResult = CmdResult;

// Runs argv like run(), killing it (SIGKILL) after timeout_s seconds.
// max_rss_kib is the child's peak RSS from wait4's rusage.
BoundedResult run_bounded(const std::vector<std::string>& argv, int timeout_s = 30);

// Every file under dir with its size and modification time, to compare before and after.
std::map<std::string, std::string> folder_state(const std::string& dir);

// Runs argv with run_bounded and checks all of the above (gtest EXPECTs):
// must_mention is the file's name (or another part of the one line).
BoundedResult expect_refused(const std::vector<std::string>& argv, const std::string& outdir,
                             const std::string& must_mention, long max_rss_mb = 300);

}  // namespace sdtest
