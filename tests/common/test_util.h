// Helpers shared by the tests: paths from the environment CTest sets, running
// the CLI, temporary folders.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace sdtest {

std::string env(const char* name);  // fails the test run if unset
std::string fixtures();             // tests/fixtures
std::string test_models();          // build/test-models (tiny-st, tiny-ckpt)
std::string cli();                  // path of the sd-txt2img binary

struct CmdResult {
    int exit_code = -1;
    std::string out, err;
    long max_rss_kib = 0;  // the process's peak resident memory (getrusage's ru_maxrss)
    bool timed_out = false;  // killed (SIGKILL) at the time limit
};

// Runs argv (no shell) with stdout/stderr captured; optional stdin text; with
// timeout_s > 0 it is killed after that many seconds (timed_out).
CmdResult run(const std::vector<std::string>& argv, const std::string& stdin_text = "", int timeout_s = 0);

// A fresh temporary folder, removed at process exit.
std::string temp_dir();

std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
// Makes the folder `dir` (and its parents) and writes each (name, text) into it.
void write_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files);
std::vector<std::string> lines(const std::string& text);

// The case folders of a shared conformance set (SD_SHARED_CONFORMANCE/SET/cases/*/)
// that hold `file`, in name order.
std::vector<std::string> shared_cases_with(const std::string& set, const std::string& file);

// The message of the sd::Error that f throws ("" when it throws none).
std::string error_of(const std::function<void()>& f);

}  // namespace sdtest
