// Replays the committed fuzz inputs through the harnesses' own entry points
// (tests/fuzz/fuzz_targets.h): the seed corpus (tests/fuzz/corpus/<target>/)
// and the inputs of the bugs fuzzing found (tests/data/fuzz-inputs/<target>/,
// docs/reliability.md). Each must end in success or the error its parser
// documents; a crash, another exception or a broken invariant fails the test.
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz_targets.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace sdfuzz {
// Test names and messages show the target's name, not its bytes.
void PrintTo(const Named& t, std::ostream* os) { *os << t.name; }
}  // namespace sdfuzz

namespace {

// The inputs of the recursion bugs are 8000 levels deep: on the 8 MiB main
// stack that was harmless (it took 100000 levels), so they run on a thread
// with 512 KiB, which they overflowed before the fix (a crash of this test).
constexpr size_t kStackBytes = 512 * 1024;

struct Job {
    sdfuzz::Target target;
    const std::string* bytes;
    std::string failure;  // empty: ended cleanly
};

void* run_job(void* arg) {
    auto* job = static_cast<Job*>(arg);
    try {
        job->target(reinterpret_cast<const uint8_t*>(job->bytes->data()), job->bytes->size());
    } catch (const std::exception& e) {
        job->failure = e.what();
    } catch (...) {
        job->failure = "an exception that is not a std::exception";
    }
    return nullptr;
}

std::string replay(sdfuzz::Target target, const std::string& bytes) {
    Job job{target, &bytes, ""};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, kStackBytes);
    pthread_t thread;
    if (pthread_create(&thread, &attr, run_job, &job) != 0) return "cannot start a thread";
    pthread_join(thread, nullptr);
    pthread_attr_destroy(&attr);
    return job.failure;
}

std::vector<fs::path> files_in(const fs::path& dir) {
    std::vector<fs::path> out;
    if (fs::is_directory(dir))
        for (const auto& e : fs::directory_iterator(dir))
            if (e.is_regular_file()) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

class FuzzInputs : public ::testing::TestWithParam<sdfuzz::Named> {};

TEST_P(FuzzInputs, EndInSuccessOrTheDocumentedError) {
    const auto& t = GetParam();
    const fs::path src = sdtest::env("SD_SOURCE_DIR");
    const auto seeds = files_in(src / "tests/fuzz/corpus" / t.name);
    const auto found = files_in(src / "tests/data/fuzz-inputs" / t.name);
    EXPECT_GE(seeds.size(), 3u) << "the seed corpus of " << t.name << " is missing";
    for (const auto* list : {&seeds, &found})
        for (const auto& f : *list) {
            SCOPED_TRACE(f.string());
            EXPECT_EQ(replay(t.run, read_bytes(f)), "");
        }
}

INSTANTIATE_TEST_SUITE_P(Harness, FuzzInputs, ::testing::ValuesIn(sdfuzz::all_targets()),
                         [](const auto& info) { return std::string(info.param.name); });

// The bugs' inputs are there, so that the replay above covers them.
TEST(FuzzInputs, FoundInputsAreCommitted) {
    const fs::path found = fs::path(sdtest::env("SD_SOURCE_DIR")) / "tests/data/fuzz-inputs";
    EXPECT_EQ(files_in(found / "model_config").size(), 4u);
    EXPECT_EQ(files_in(found / "prompts").size(), 1u);
    EXPECT_EQ(files_in(found / "image_reader").size(), 5u);
}

}  // namespace
