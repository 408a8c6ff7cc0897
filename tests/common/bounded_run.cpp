#include "bounded_run.h"

#include <sys/stat.h>

#include <filesystem>

#include <gtest/gtest.h>

namespace sdtest {

BoundedResult run_bounded(const std::vector<std::string>& argv, int timeout_s) { return run(argv, "", timeout_s); }

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
