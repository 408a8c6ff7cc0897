#include "test_util.h"

#include "sd/error.h"


#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace sdtest {

std::string env(const char* name) {
    if (const char* v = std::getenv(name)) return v;
    // Defaults compiled in by tests/CMakeLists.txt; the environment may override them.
    const std::string n = name;
    if (n == "SD_TXT2IMG") return SD_TXT2IMG;
    if (n == "SD_FIXTURES") return SD_FIXTURES;
    if (n == "SD_SHARED_CONFORMANCE") return SD_SHARED_CONFORMANCE;
    if (n == "SD_TEST_MODELS") return SD_TEST_MODELS;
    if (n == "SD_SOURCE_DIR") return SD_SOURCE_DIR;
    if (n == "SD_PYTHON") return SD_PYTHON;
    throw std::runtime_error(std::string("unknown test setting ") + name);
}

std::string fixtures() { return env("SD_FIXTURES"); }
std::string test_models() { return env("SD_TEST_MODELS"); }
std::string cli() { return env("SD_TXT2IMG"); }

namespace {
struct TempRoot {
    std::string path;
    TempRoot() {
        char tmpl[] = "/tmp/sd-test-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempRoot() {
        std::error_code ec;
        std::filesystem::permissions(path, std::filesystem::perms::all, ec);
        std::filesystem::remove_all(path, ec);
    }
};
TempRoot& root() {
    static TempRoot r;
    return r;
}
}  // namespace

std::string temp_dir() {
    static int n = 0;
    std::string p = root().path + "/t" + std::to_string(n++);
    std::filesystem::create_directories(p);
    return p;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

void write_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files) {
    std::filesystem::create_directories(dir);
    for (const auto& [name, text] : files) write_text(dir + "/" + name, text);
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> v;
    std::istringstream in(text);
    std::string l;
    while (std::getline(in, l)) v.push_back(l);
    return v;
}

CmdResult run(const std::vector<std::string>& argv, const std::string& stdin_text, int timeout_s) {
    const std::string dir = temp_dir();
    const std::string in_path = dir + "/stdin", out_path = dir + "/stdout", err_path = dir + "/stderr";
    write_text(in_path, stdin_text);
    pid_t pid = fork();
    if (pid == 0) {
        int in = open(in_path.c_str(), O_RDONLY);
        int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    CmdResult r;
    int status = 0;
    struct rusage usage {};
    if (timeout_s <= 0) {
        wait4(pid, &status, 0, &usage);
    } else {
        // A hang is a failure, not a wait: killed at the deadline.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
        while (wait4(pid, &status, WNOHANG, &usage) != pid) {
            if (std::chrono::steady_clock::now() > deadline) {
                kill(pid, SIGKILL);
                wait4(pid, &status, 0, &usage);
                r.timed_out = true;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    r.max_rss_kib = usage.ru_maxrss;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_text(out_path);
    r.err = read_text(err_path);
    return r;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const sd::Error& e) {
        return e.what();
    }
    return "";
}

std::vector<std::string> shared_cases_with(const std::string& set, const std::string& file) {
    std::vector<std::string> dirs;
    for (const auto& e : std::filesystem::directory_iterator(env("SD_SHARED_CONFORMANCE") + "/" + set + "/cases"))
        if (std::filesystem::exists(e.path() / file)) dirs.push_back(e.path().string());
    std::sort(dirs.begin(), dirs.end());
    return dirs;
}

}  // namespace sdtest
