#include "bounded_run.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

namespace sdtest {

BoundedResult run_bounded(const std::vector<std::string>& argv, int timeout_s) {
    const std::string dir = temp_dir();
    const std::string out_path = dir + "/stdout", err_path = dir + "/stderr";
    const pid_t pid = fork();
    if (pid == 0) {
        const int in = open("/dev/null", O_RDONLY);
        const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    BoundedResult r;
    int status = 0;
    struct rusage usage {};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
        if (wait4(pid, &status, WNOHANG, &usage) == pid) break;
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid, SIGKILL);
            wait4(pid, &status, 0, &usage);
            r.timed_out = true;
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    r.max_rss_kib = usage.ru_maxrss;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_text(out_path);
    r.err = read_text(err_path);
    return r;
}

std::map<std::string, std::string> folder_state(const std::string& dir) {
    namespace fs = std::filesystem;
    std::map<std::string, std::string> state;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        struct stat st {};
        if (lstat(it->path().c_str(), &st) != 0) continue;
        state[it->path().string()] = std::to_string(st.st_size) + "@" + std::to_string(st.st_mtim.tv_sec) + "." +
                                     std::to_string(st.st_mtim.tv_nsec);
    }
    return state;
}

BoundedResult expect_refused(const std::vector<std::string>& argv, const std::string& outdir,
                             const std::string& must_mention, long max_rss_mb) {
    const auto before = folder_state(outdir);
    BoundedResult r = run_bounded(argv);
    EXPECT_FALSE(r.timed_out) << "still running after 30 s (a hang?)";
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << "exit " << r.exit_code << "\n" << r.err;
    EXPECT_EQ(lines(r.err).size(), 1u) << "stderr:\n" << r.err;
    EXPECT_NE(r.err.find(must_mention), std::string::npos) << "stderr should name '" << must_mention << "':\n" << r.err;
    for (const char* bad : {"terminate called", "Traceback", "Exception raised from", "Segmentation", "bad_alloc"})
        EXPECT_EQ(r.err.find(bad), std::string::npos) << r.err;
    EXPECT_LT(r.max_rss_kib, max_rss_mb * 1024) << "peak RSS " << r.max_rss_kib / 1024 << " MB\n" << r.err;
    EXPECT_EQ(folder_state(outdir), before) << "the output folder changed";
    return r;
}

}  // namespace sdtest
