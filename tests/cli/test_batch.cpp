// Batch generation and shell pipelines (issue 4): prompt files and JSON lines,
// seeds, names, PNG metadata, --json, exit codes, progress, interruption,
// resume and shards. Unit tests first (no model), then the CLI on the tiny model.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "io/image_io.h"
#include "io/npy.h"
#include "io/png_text.h"
#include "io/sha256.h"
#include "sd/progress.h"
#include "sd/prompts.h"
#include "test_util.h"
#include "run/batch_plan.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string model() { return sdtest::test_models() + "/tiny-st"; }

// The common flags of a small, fast run.
std::vector<std::string> fast_args(const std::string& outdir, int steps = 4) {
    return {sdtest::cli(), "--model", model(), "--outdir", outdir, "--threads", "1",
            "--H", "64", "--W", "64", "--steps", std::to_string(steps)};
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    const std::string s = sdtest::read_text(path);
    return std::vector<uint8_t>(s.begin(), s.end());
}

// Regular files in dir, name -> bytes.
std::map<std::string, std::string> files_of(const std::string& dir) {
    std::map<std::string, std::string> m;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file()) m[e.path().filename().string()] = sdtest::read_text(e.path().string());
    return m;
}

std::string seven_prompts_file(const std::string& dir) {
    const std::string path = dir + "/prompts.txt";
    sdtest::write_text(path,
                       "a red fox\n# a comment\n\na blue bird\r\na green frog\nun café au lait, 猫\n"
                       "a yellow sun\n  \na purple cow\na white swan\n");
    return path;
}

// ---- processes that the tests watch and signal ----

struct Child {
    pid_t pid = -1;
    int err_fd = -1;  // read end of the child's stderr
    std::string err;  // what was read so far
};

// Starts argv with stdout to out_path and stderr to a pipe. Optional file size
// limit (for a "full disk") applied in the child only.
Child spawn(const std::vector<std::string>& argv, const std::string& out_path, long fsize_limit = -1) {
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe");
    Child c;
    c.pid = fork();
    if (c.pid == 0) {
        int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int in = open("/dev/null", O_RDONLY);
        dup2(in, 0);
        dup2(out, 1);
        dup2(p[1], 2);
        close(p[0]);
        if (fsize_limit >= 0) {
            rlimit rl{static_cast<rlim_t>(fsize_limit), static_cast<rlim_t>(fsize_limit)};
            setrlimit(RLIMIT_FSIZE, &rl);
            signal(SIGXFSZ, SIG_IGN);  // writes then fail with EFBIG, as on a full disk
        }
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    close(p[1]);
    c.err_fd = p[0];
    return c;
}

// Reads the child's stderr until `seen` returns true for it (true) or it ends (false).
bool read_until(Child& c, const std::function<bool(const std::string&)>& seen, int timeout_s = 120) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    char buf[4096];
    while (!seen(c.err)) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        pollfd pfd{c.err_fd, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0) continue;
        ssize_t n = read(c.err_fd, buf, sizeof buf);
        if (n <= 0) return seen(c.err);
        c.err.append(buf, static_cast<size_t>(n));
    }
    return true;
}

// Waits for the child, draining stderr; returns the exit code (128 + signal when killed).
int finish(Child& c) {
    char buf[4096];
    ssize_t n;
    while ((n = read(c.err_fd, buf, sizeof buf)) > 0) c.err.append(buf, static_cast<size_t>(n));
    close(c.err_fd);
    int status = 0;
    waitpid(c.pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// True once the progress shows the given image at or past the given step.
std::function<bool(const std::string&)> at_step(int image, int total, int step) {
    return [=](const std::string& err) {
        for (int s = step; s <= step + 40; ++s) {
            const std::string key = "image " + std::to_string(image) + "/" + std::to_string(total) + "  step " + std::to_string(s) + "/";
            const std::string key_batch = "-" + std::to_string(image) + "/" + std::to_string(total) + "  step " + std::to_string(s) + "/";
            if (err.find(key) != std::string::npos || err.find(key_batch) != std::string::npos) return true;
        }
        return false;
    };
}

void expect_only_whole_pngs(const std::string& dir, int max_temp_files) {
    int temps = 0;
    for (const auto& [name, bytes] : files_of(dir)) {
        if (name.find(".tmp-") != std::string::npos) {
            ++temps;
            continue;
        }
        ASSERT_EQ(name.substr(name.size() - 4), ".png") << name;
        std::vector<uint8_t> b(bytes.begin(), bytes.end());
        EXPECT_NO_THROW(sd::png_read_text(b)) << name << " is not a whole PNG";
        EXPECT_NO_THROW(sd::read_png(dir + "/" + name)) << name;
    }
    EXPECT_LE(temps, max_temp_files);
}

// One clear line on stderr, exit status 1, no crash.
void expect_input_error(const sdtest::CmdResult& r, const std::string& must_mention) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    auto err_lines = sdtest::lines(r.err);
    EXPECT_EQ(err_lines.size(), 1u) << "stderr:\n" << r.err;
    EXPECT_EQ(r.err.rfind("sd-txt2img: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(must_mention), std::string::npos) << "stderr should mention '" << must_mention << "':\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
}

sdtest::CmdResult run_jsonl(const std::string& text, const std::vector<std::string>& extra = {}) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.jsonl", text);
    return sdtest::run(plus(plus(fast_args(dir + "/out"), {"--quiet", "--from-file", dir + "/p.jsonl"}), extra));
}

}  // namespace

// Acceptance: 7 prompts, --n_samples 3 --n_iter 3 -> 21 images in batches of 3, 3, 1;
// the JSON lines parse and match the files and their PNG text.
TEST(Batch, SevenPromptsThreeSamplesThreeIterationsGive21Images) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(plus(fast_args(dir + "/out"),
                              {"--from-file", seven_prompts_file(dir), "--n_samples", "3", "--n_iter", "3", "--json",
                               "--save-latents", dir + "/l.npy", "--grid"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto out = sdtest::lines(r.out);
    ASSERT_EQ(out.size(), 22u);
    // The last record is the grid's.
    json grid = json::parse(out.back());
    out.pop_back();
    EXPECT_EQ(grid["path"], dir + "/out/grid-0000.png");
    EXPECT_EQ(grid["grid"], true);
    EXPECT_EQ(grid["images"], 21);
    EXPECT_EQ(sd::png_read_text(read_bytes(grid["path"]))["parameters"], grid["parameters"].get<std::string>());
    const std::vector<std::string> prompts = {"a red fox", "a blue bird", "a green frog", "un café au lait, 猫",
                                              "a yellow sun", "a purple cow", "a white swan"};
    const std::vector<int> file_lines = {1, 4, 5, 6, 7, 9, 10};
    std::set<std::string> paths;
    const std::string tiny_hash = sd::sha256_file_hex(sdtest::fixtures() + "/tiny/tiny.safetensors").substr(0, 10);
    for (size_t i = 0; i < out.size(); ++i) {
        json j = json::parse(out[i]);
        EXPECT_EQ(j["index"], i);
        EXPECT_EQ(j["prompt"], prompts[i % 7]);
        EXPECT_EQ(j["line"], file_lines[i % 7]);
        EXPECT_EQ(j["seed"], 42);
        EXPECT_EQ(j["seed_mode"], "compvis");
        EXPECT_EQ(j["steps"], 4);
        EXPECT_EQ(j["sampler"], "plms");
        EXPECT_EQ(j["scale"], 7.5);
        EXPECT_EQ(j["size"], "64x64");
        EXPECT_EQ(j["model"], "tiny");
        EXPECT_TRUE(j["seconds"].is_number());
        const std::string path = j["path"];
        paths.insert(path);
        ASSERT_TRUE(fs::exists(path)) << path;
        auto texts = sd::png_read_text(read_bytes(path));
        EXPECT_EQ(texts["parameters"], j["parameters"].get<std::string>());
        // "Model hash": the checkpoint's SHA-256, first 10 digits (A1111's short hash).
        EXPECT_EQ(texts["parameters"].rfind(prompts[i % 7] + "\nSteps: 4, Sampler: PLMS, CFG scale: 7.5, Seed: 42, Size: 64x64, Model hash: " + tiny_hash + ", Model: tiny", 0), 0u)
            << texts["parameters"];
        auto img = sd::read_png(path);
        EXPECT_EQ(img.width, 64);
    }
    EXPECT_EQ(paths.size(), 21u);
    EXPECT_EQ(files_of(dir + "/out").size(), 22u);  // the grid, nothing else left there
    // The batches, as the progress lines show them.
    for (const char* b : {"images 1-3/21", "images 4-6/21", "image 7/21  step", "images 8-10/21", "image 21/21  step 4/4"})
        EXPECT_NE(r.err.find(b), std::string::npos) << b << "\n" << r.err;
    EXPECT_EQ(r.err.find("image 8/21"), std::string::npos);
    EXPECT_EQ(sd::read_npy(dir + "/l.npy").shape, (std::vector<int64_t>{21, 4, 8, 8}));
}

TEST(Batch, PromptsFromStdin) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(plus(fast_args(dir), {"--quiet", "--from-file", "-"}), "one\n\ntwo\n");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(sdtest::lines(r.out).size(), 2u);
    EXPECT_EQ(sd::png_read_text(read_bytes(dir + "/00001.png"))["parameters"].rfind("two\n", 0), 0u);
}

// A producer and a consumer on either side of the tool: each line's image is
// made and its JSON record printed before the next line is written. The images
// are those of the same lines read from a file (compvis seeds: one generator
// for the whole stream). While it waits, `pgrep -x sd-txt2img` finds it.
TEST(Batch, StreamedPromptsAreServedOneLineAtATime) {
    const std::string dir = sdtest::temp_dir();
    int in[2], out[2];
    ASSERT_EQ(pipe(in), 0);
    ASSERT_EQ(pipe(out), 0);
    const auto argv = plus(fast_args(dir + "/stream", 2), {"--quiet", "--json", "--from-file", "-"});
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    std::string got;
    // Reads stdout until it holds `lines` lines; false after 60 s.
    auto wait_lines = [&](size_t lines) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        char buf[4096];
        while (static_cast<size_t>(std::count(got.begin(), got.end(), '\n')) < lines) {
            if (std::chrono::steady_clock::now() > deadline) return false;
            pollfd pfd{out[0], POLLIN, 0};
            if (poll(&pfd, 1, 200) <= 0) continue;
            const ssize_t n = read(out[0], buf, sizeof buf);
            if (n <= 0) return false;
            got.append(buf, static_cast<size_t>(n));
        }
        return true;
    };
    auto send = [&](const std::string& line) { ASSERT_EQ(write(in[1], line.data(), line.size()), static_cast<ssize_t>(line.size())); };
    send("a red fox\n");
    const bool first = wait_lines(1);
    EXPECT_TRUE(first) << "no record for the first line while the stream stays open";
    // The process is named after its executable (pgrep -x finds it).
    if (first) {
        auto pg = sdtest::run({"/usr/bin/pgrep", "-x", "sd-txt2img"});
        EXPECT_NE(("\n" + pg.out).find("\n" + std::to_string(pid) + "\n"), std::string::npos) << "pgrep printed:\n" << pg.out;
    }
    send("a blue bird\n");
    EXPECT_TRUE(wait_lines(2)) << got;
    close(in[1]);
    char rest[256];
    while (read(out[0], rest, sizeof rest) > 0) {}
    close(out[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    const auto records = sdtest::lines(got);
    ASSERT_EQ(records.size(), 2u) << got;
    EXPECT_EQ(json::parse(records[1])["prompt"], "a blue bird");
    EXPECT_EQ(json::parse(records[1])["index"], 1);

    sdtest::write_text(dir + "/p.txt", "a red fox\na blue bird\n");
    auto file = sdtest::run(plus(fast_args(dir + "/file", 2), {"--quiet", "--from-file", dir + "/p.txt"}));
    ASSERT_EQ(file.exit_code, 0) << file.err;
    for (const char* name : {"00000.png", "00001.png"})
        EXPECT_EQ(sdtest::read_text(dir + "/stream/" + name), sdtest::read_text(dir + "/file/" + name)) << name;
}

TEST(Batch, JsonlOverridesReachTheImages) {
    auto r = run_jsonl("{\"prompt\": \"wide\", \"W\": 96, \"steps\": 2, \"sampler\": \"ddim\", \"scale\": 3}\n"
                       "{\"prompt\": \"tall\", \"H\": 96, \"n_iter\": 2}\n"
                       "{\"prompt\": \"karras\", \"sampler\": \"euler\", \"schedule\": \"karras\", \"steps\": 2, \"n_iter\": 1}\n",
                       {"--json", "--grid"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto out = sdtest::lines(r.out);
    ASSERT_EQ(out.size(), 4u) << r.out;  // no grid: the sizes differ
    json k = json::parse(out[2]);
    EXPECT_EQ(k["prompt"], "karras");
    EXPECT_EQ(k["schedule"], "karras");
    EXPECT_EQ(k["sampler"], "euler");
    EXPECT_EQ(json::parse(out[0])["schedule"], "default");
    json a = json::parse(out[0]), b = json::parse(out[1]), c = json::parse(out[3]);  // the second iteration
    EXPECT_EQ(a["size"], "96x64");
    EXPECT_EQ(a["sampler"], "ddim");
    EXPECT_EQ(a["steps"], 2);
    EXPECT_EQ(a["scale"], 3);
    EXPECT_EQ(sd::read_png(a["path"]).width, 96);
    EXPECT_EQ(sd::read_png(b["path"]).height, 96);
    EXPECT_EQ(c["prompt"], "tall");
    EXPECT_NE(a["parameters"].get<std::string>().find("Steps: 2, Sampler: DDIM, CFG scale: 3, Seed: 42, Size: 96x64"),
              std::string::npos);
}

// Per-image seeds: any image can be made again alone from its recorded seed.
TEST(Batch, PerImageSeedRegeneratesAnImageAlone) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(plus(fast_args(dir + "/all"),
                              {"--quiet", "--json", "--seed-mode", "per-image", "--seed", "100", "--prompt", "a boat",
                               "--n_samples", "2", "--n_iter", "2"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto out = sdtest::lines(r.out);
    ASSERT_EQ(out.size(), 4u);
    json third = json::parse(out[2]);
    EXPECT_EQ(third["seed"], 102);
    EXPECT_EQ(third["index"], 2);
    auto alone = sdtest::run(plus(fast_args(dir + "/one"), {"--quiet", "--seed-mode", "per-image", "--seed", "102", "--prompt", "a boat"}));
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(sd::read_png(third["path"]).rgb, sd::read_png(dir + "/one/00000.png").rgb);
    EXPECT_NE(sd::read_png(json::parse(out[1])["path"]).rgb, sd::read_png(dir + "/one/00000.png").rgb);
}

// compvis seeds stay the default: a second iteration continues the run's generator.
TEST(Batch, CompvisModeDrawsEachBatchFromOneGenerator) {
    const std::string dir = sdtest::temp_dir();
    auto two = sdtest::run(plus(fast_args(dir + "/two"), {"--quiet", "--prompt", "x", "--n_iter", "2"}));
    auto per = sdtest::run(plus(fast_args(dir + "/per"), {"--quiet", "--prompt", "x", "--n_iter", "2", "--seed-mode", "per-image"}));
    ASSERT_EQ(two.exit_code, 0) << two.err;
    ASSERT_EQ(per.exit_code, 0) << per.err;
    // the first image is the same (seed 42, one draw); the second is not
    EXPECT_EQ(sd::read_png(dir + "/two/00000.png").rgb, sd::read_png(dir + "/per/00000.png").rgb);
    EXPECT_NE(sd::read_png(dir + "/two/00001.png").rgb, sd::read_png(dir + "/per/00001.png").rgb);
}

TEST(Batch, NamePatternAndGrid) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(plus(fast_args(dir),
                              {"--quiet", "--seed-mode", "per-image", "--name", "{index}-{seed}-{prompt}", "--prompt",
                               "a red/blue cat", "--n_samples", "2", "--n_iter", "2", "--grid"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // The grid is a written image too: its path is the last line of stdout (also with --quiet).
    EXPECT_EQ(r.out, dir + "/00000-42-a_red_blue_cat.png\n" + dir + "/00001-43-a_red_blue_cat.png\n" + dir +
                         "/00002-44-a_red_blue_cat.png\n" + dir + "/00003-45-a_red_blue_cat.png\n" + dir +
                         "/grid-0000.png\n");
    auto grid = sd::read_png(dir + "/grid-0000.png");
    EXPECT_EQ(grid.width, 2 * 66 + 2);
    EXPECT_EQ(grid.height, 2 * 66 + 2);
    // Its metadata: the first image's, as AUTOMATIC1111 labels a grid, and how many images it shows.
    const std::string grid_text = sd::png_read_text(read_bytes(dir + "/grid-0000.png"))["parameters"];
    const std::string first_text = sd::png_read_text(read_bytes(dir + "/00000-42-a_red_blue_cat.png"))["parameters"];
    EXPECT_EQ(grid_text, first_text + ", Grid images: 4");
    // A second run with the same names refuses to replace them.
    auto again = sdtest::run(plus(fast_args(dir), {"--quiet", "--seed-mode", "per-image", "--name", "{index}-{seed}-{prompt}",
                                                   "--prompt", "a red/blue cat"}));
    expect_input_error(again, "already exists");
}

TEST(Batch, NegativePromptRecordedAndUsed) {
    const std::string dir = sdtest::temp_dir();
    auto plain = sdtest::run(plus(fast_args(dir + "/a"), {"--quiet", "--prompt", "a cat"}));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    auto neg = sdtest::run(plus(fast_args(dir + "/b"), {"--quiet", "--json", "--prompt", "a cat", "--negative-prompt", "blurry, dark"}));
    if (neg.exit_code == 1 && neg.err.find("not supported by this build's pipeline") != std::string::npos)
        GTEST_SKIP() << "the pipeline has no GenerateSettings::negative_prompt yet";
    ASSERT_EQ(neg.exit_code, 0) << neg.err;
    json j = json::parse(neg.out);
    EXPECT_EQ(j["negative_prompt"], "blurry, dark");
    EXPECT_NE(j["parameters"].get<std::string>().find("\nNegative prompt: blurry, dark\n"), std::string::npos);
    EXPECT_NE(sd::read_png(dir + "/a/00000.png").rgb, sd::read_png(j["path"]).rgb);
}

// Acceptance: shards 0/3, 1/3, 2/3 together equal the unsharded run, byte for byte.
TEST(Shards, ThreeShardsEqualTheUnshardedRunByteForByte) {
    const std::string dir = sdtest::temp_dir();
    const std::string prompts = seven_prompts_file(dir);
    auto common = plus(fast_args("", 2), {"--quiet", "--from-file", prompts, "--seed-mode", "per-image", "--seed", "5", "--n_iter", "2", "--n_samples", "3"});
    auto with_outdir = [&](const std::string& out) {
        auto a = common;
        a[4] = out;
        return a;
    };
    auto whole = sdtest::run(with_outdir(dir + "/whole"));
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    std::vector<std::string> shard_paths;
    for (int k = 0; k < 3; ++k) {
        auto r = sdtest::run(plus(with_outdir(dir + "/sharded"), {"--shard", std::to_string(k) + "/3"}));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        for (const auto& l : sdtest::lines(r.out)) shard_paths.push_back(l);
    }
    EXPECT_EQ(shard_paths.size(), 14u);
    auto a = files_of(dir + "/whole"), b = files_of(dir + "/sharded");
    ASSERT_EQ(a.size(), 14u);
    EXPECT_EQ(a, b);
}

// Acceptance: SIGINT in the middle of a batch: exit 130, a summary, only whole
// images; --skip-existing then finishes with the images of an uninterrupted run.
namespace {

// The tool with only the given sharding variables in its environment.
std::vector<std::string> with_env(const std::vector<std::string>& vars, const std::vector<std::string>& argv) {
    std::vector<std::string> a = {"/usr/bin/env"};
    for (const char* v : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
                          "SLURM_ARRAY_TASK_STEP", "JOB_COMPLETION_INDEX", "SD_SHARD_COUNT"})
        a.insert(a.end(), {"-u", v});
    return plus(plus(a, vars), argv);
}

}  // namespace

// Acceptance: --shard auto under a Slurm job array (COUNT, or MIN/MAX) and a
// Kubernetes Indexed Job does what --shard 1/3 does; without either it says what it needs.
TEST(Shards, AutoFromSlurmAndIndexedJobVariablesEqualsKOverN) {
    const std::string dir = sdtest::temp_dir();
    const std::string prompts = seven_prompts_file(dir);
    auto args = [&](const std::string& out, const std::string& shard) {
        return plus(fast_args(dir + "/" + out, 2), {"--quiet", "--from-file", prompts, "--seed-mode", "per-image", "--shard", shard});
    };
    auto ref = sdtest::run(with_env({}, args("ref", "1/3")));
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    ASSERT_EQ(files_of(dir + "/ref").size(), 2u);  // prompts 1 and 4
    const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
        {"slurm", {"SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_COUNT=3"}},
        {"minmax", {"SLURM_ARRAY_TASK_ID=5", "SLURM_ARRAY_TASK_MIN=4", "SLURM_ARRAY_TASK_MAX=6"}},
        {"indexed", {"JOB_COMPLETION_INDEX=1", "SD_SHARD_COUNT=3"}}};
    for (const auto& [name, vars] : cases) {
        auto r = sdtest::run(with_env(vars, args(name, "auto")));
        ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
        EXPECT_EQ(files_of(dir + "/" + name), files_of(dir + "/ref")) << name;
    }
    expect_input_error(sdtest::run(with_env({}, args("none", "auto"))), "--shard auto needs SLURM_ARRAY_TASK_ID");
    expect_input_error(sdtest::run(with_env({"JOB_COMPLETION_INDEX=1"}, args("none", "auto"))), "SD_SHARD_COUNT is not");
    expect_input_error(sdtest::run(with_env({"SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=3"}, args("none", "auto"))),
                       "gives shard 3/3");
}

// Acceptance: GNU parallel (docs/cluster.md's command line) over 3 shards gives
// the unsharded run's images byte for byte, the concatenated manifests list
// every image exactly once, and --resume then runs nothing again.
TEST(Shards, GnuParallelOverThreeShardsEqualsTheUnshardedRun) {
    ASSERT_EQ(sdtest::run({"/bin/sh", "-c", "command -v parallel"}).exit_code, 0)
        << "GNU parallel is not installed (scripts/setup.sh installs it)";
    const std::string dir = sdtest::temp_dir();
    const std::string prompts = seven_prompts_file(dir);
    auto common = plus(fast_args(dir + "/all", 2), {"--quiet", "--from-file", prompts, "--seed-mode", "per-image", "--seed", "3"});
    auto all = sdtest::run(common);
    ASSERT_EQ(all.exit_code, 0) << all.err;
    common[4] = dir + "/par";
    std::string cmd = "parallel --will-cite --joblog " + dir + "/joblog --resume";
    for (const auto& a : common) cmd += " '" + a + "'";
    cmd += " --shard {}/3 --manifest " + dir + "/m-{}.jsonl ::: 0 1 2";
    auto par = sdtest::run({"/bin/sh", "-c", cmd});
    ASSERT_EQ(par.exit_code, 0) << par.err;
    EXPECT_EQ(files_of(dir + "/par"), files_of(dir + "/all"));
    auto manifests = [&] {
        return sdtest::read_text(dir + "/m-0.jsonl") + sdtest::read_text(dir + "/m-1.jsonl") + sdtest::read_text(dir + "/m-2.jsonl");
    };
    std::map<int, int> seen;
    std::set<std::string> hashes;
    for (const auto& l : sdtest::lines(manifests())) {
        json m = json::parse(l);
        seen[m["index"].get<int>()]++;
        hashes.insert(m["model_hash"].get<std::string>());
        EXPECT_EQ(m["status"], "written");
        EXPECT_TRUE(fs::exists(m["path"].get<std::string>())) << l;
        EXPECT_EQ(m["parameters"], sd::png_read_text(read_bytes(m["path"]))["parameters"]);
    }
    ASSERT_EQ(seen.size(), 7u);
    for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << "image " << index;
    EXPECT_EQ(seen.begin()->first, 0);
    EXPECT_EQ(seen.rbegin()->first, 6);
    ASSERT_EQ(hashes.size(), 1u);
    EXPECT_EQ(hashes.begin()->size(), 16u);
    // The joblog says every shard is done: nothing runs again, nothing is added.
    const std::string before = manifests();
    auto again = sdtest::run({"/bin/sh", "-c", cmd});
    EXPECT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(manifests(), before);
}

TEST(Interrupt, SigintMidBatchThenResumeEqualsUninterruptedRun) {
    const std::string dir = sdtest::temp_dir();
    const std::string prompts = seven_prompts_file(dir);
    auto args = [&](const std::string& out) {
        return plus(fast_args(out, 12), {"--from-file", prompts, "--seed-mode", "per-image"});
    };
    Child c = spawn(args(dir + "/run"), dir + "/stdout");
    ASSERT_TRUE(read_until(c, at_step(3, 7, 2))) << c.err;
    kill(c.pid, SIGINT);
    const int code = finish(c);
    EXPECT_EQ(code, 130) << c.err;
    EXPECT_NE(c.err.find("interrupted: 2 of 7 images written"), std::string::npos) << c.err;
    EXPECT_EQ(c.err.find("image 4/7"), std::string::npos) << "went on after the signal\n" << c.err;
    expect_only_whole_pngs(dir + "/run", 0);
    EXPECT_EQ(files_of(dir + "/run").size(), 2u);
    EXPECT_EQ(sdtest::lines(sdtest::read_text(dir + "/stdout")).size(), 2u);

    auto resumed = sdtest::run(plus(args(dir + "/run"), {"--quiet", "--skip-existing", "--json"}));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    auto out = sdtest::lines(resumed.out);
    ASSERT_EQ(out.size(), 5u);
    EXPECT_EQ(json::parse(out[0])["index"], 2);
    auto whole = sdtest::run(plus(args(dir + "/whole"), {"--quiet"}));
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    EXPECT_EQ(files_of(dir + "/run"), files_of(dir + "/whole"));
}

// compvis batches of 3: the batch being sampled is abandoned, earlier ones stay.
TEST(Interrupt, SigtermMidCompvisBatchKeepsWholeBatchesOnly) {
    const std::string dir = sdtest::temp_dir();
    Child c = spawn(plus(fast_args(dir + "/run", 12), {"--from-file", seven_prompts_file(dir), "--n_samples", "3"}), dir + "/stdout");
    ASSERT_TRUE(read_until(c, at_step(6, 7, 2))) << c.err;
    kill(c.pid, SIGTERM);
    EXPECT_EQ(finish(c), 130) << c.err;
    EXPECT_NE(c.err.find("interrupted: 3 of 7 images written"), std::string::npos) << c.err;
    expect_only_whole_pngs(dir + "/run", 0);
    EXPECT_EQ(files_of(dir + "/run").size(), 3u);
}

// Acceptance: SIGKILL leaves at most a temporary file, never a truncated PNG
// under a final name; --skip-existing then completes the run.
TEST(Interrupt, SigkillMidBatchThenResumeEqualsUninterruptedRun) {
    const std::string dir = sdtest::temp_dir();
    const std::string prompts = seven_prompts_file(dir);
    auto args = [&](const std::string& out) {
        return plus(fast_args(out, 12), {"--from-file", prompts, "--seed-mode", "per-image", "--quiet"});
    };
    Child c = spawn(plus(args(dir + "/run"), {"--skip-existing"}), dir + "/stdout");
    // wait for the third image to be written, then kill while the fourth is sampled or written
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (sdtest::lines(sdtest::read_text(dir + "/stdout")).size() < 3 && std::chrono::steady_clock::now() < deadline)
        usleep(20000);
    usleep(100000);
    kill(c.pid, SIGKILL);
    EXPECT_EQ(finish(c), 128 + SIGKILL);
    expect_only_whole_pngs(dir + "/run", 1);
    const size_t before = files_of(dir + "/run").size();
    EXPECT_GE(before, 3u);
    EXPECT_LT(before, 7u);

    auto resumed = sdtest::run(plus(args(dir + "/run"), {"--skip-existing"}));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    auto whole = sdtest::run(args(dir + "/whole"));
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    auto got = files_of(dir + "/run");
    for (auto it = got.begin(); it != got.end();) it = it->first.find(".tmp-") != std::string::npos ? got.erase(it) : std::next(it);
    EXPECT_EQ(got, files_of(dir + "/whole"));
}

// A full disk midway: a clear error, exit 2, the earlier images stay whole, no temporary files.
TEST(ExitCodes, WriteFailureMidwayIsRuntimeErrorAndEarlierImagesStay) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.jsonl", "{\"prompt\": \"small\"}\n{\"prompt\": \"big\", \"H\": 256, \"W\": 256}\n");
    // A 64x64 image is about 12 KB, a 256x256 one far more than the 40 KB allowed.
    Child c = spawn(plus(fast_args(dir + "/out", 2), {"--quiet", "--from-file", dir + "/p.jsonl"}), dir + "/stdout", 40000);
    const int code = finish(c);
    EXPECT_EQ(code, 2) << c.err;
    EXPECT_NE(c.err.find("sd-txt2img: error: cannot write " + dir + "/out/00001.png"), std::string::npos) << c.err;
    EXPECT_NE(c.err.find("1 image was written before the failure and is whole"), std::string::npos) << c.err;
    EXPECT_EQ(sdtest::read_text(dir + "/stdout"), dir + "/out/00000.png\n");
    expect_only_whole_pngs(dir + "/out", 0);
    EXPECT_EQ(files_of(dir + "/out").size(), 1u);
}

// ---- progress ----

TEST(ProgressDisplay, PlainLinesInAPipe) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(plus(fast_args(dir), {"--prompt", "x", "--n_iter", "2"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find('\r'), std::string::npos);
    EXPECT_EQ(r.err.find('\033'), std::string::npos);
    auto l = sdtest::lines(r.err);
    ASSERT_EQ(l.size(), 8u) << r.err;  // 2 images x 4 steps
    EXPECT_EQ(l[0].rfind("sd-txt2img: image 1/2  step 1/4  ", 0), 0u) << l[0];
    EXPECT_NE(l[0].find(" s/step  ETA "), std::string::npos);
    EXPECT_EQ(l[7].rfind("sd-txt2img: image 2/2  step 4/4  ", 0), 0u) << l[7];
    EXPECT_EQ(sdtest::lines(r.out).size(), 2u);  // stdout: only the paths
}

TEST(ProgressDisplay, QuietIsSilent) {
    const std::string dir = sdtest::temp_dir();
    auto r = sdtest::run(plus(fast_args(dir), {"--prompt", "x", "--quiet"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
}

// Under a pseudo-terminal: a bar redrawn in place with \r, cleared at the end.
TEST(ProgressDisplay, BarOnAPseudoTerminal) {
    const std::string dir = sdtest::temp_dir();
    const auto argv = plus(fast_args(dir + "/out"), {"--prompt", "x", "--n_iter", "2"});
    int master = -1;
    winsize ws{};
    ws.ws_col = 100;
    ws.ws_row = 30;
    pid_t pid = forkpty(&master, nullptr, nullptr, &ws);
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        int out = open((dir + "/stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);  // stdout to a file, stderr stays on the terminal
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    std::string tty;
    char buf[4096];
    for (;;) {
        ssize_t n = read(master, buf, sizeof buf);  // EIO once the child has gone
        if (n <= 0) break;
        tty.append(buf, static_cast<size_t>(n));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    close(master);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0) << tty;
    EXPECT_NE(tty.find("\r\033[K["), std::string::npos) << tty;
    EXPECT_NE(tty.find("] image 1/2  step 1/4  "), std::string::npos) << tty;
    EXPECT_NE(tty.find("] image 2/2  step 4/4  "), std::string::npos) << tty;
    EXPECT_NE(tty.find(" s/step  ETA "), std::string::npos);
    EXPECT_NE(tty.find("[" + std::string(30, '#') + "]"), std::string::npos) << "a full bar at the end\n" << tty;
    EXPECT_EQ(tty.find("sd-txt2img: image"), std::string::npos) << "plain lines on a terminal\n" << tty;
    EXPECT_EQ(tty.find('\n'), std::string::npos) << "the bar must stay on one line\n" << tty;
    EXPECT_EQ(tty.size() >= 4 ? tty.substr(tty.size() - 4) : "", "\r\033[K") << "bar not cleared at the end";
    EXPECT_EQ(sdtest::lines(sdtest::read_text(dir + "/stdout")).size(), 2u);
}

// ---- bad input: one clear line naming the problem, exit 1, one test each ----

// One bad JSONL file each (named for what is wrong): exit 1, one line naming file, line and problem.
TEST(BadBatchInput, JsonlLinesAreRefusedNamingFileAndLine) {
    struct Case { std::string name, jsonl, says; std::vector<std::string> extra; };
    const std::vector<Case> cases = {
        {"JsonlUnknownKey", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"stesp\": 5}\n",
         "p.jsonl:2: unknown key \"stesp\""},
        {"JsonlNotAnObject", "[\"a cat\"]\n",
         "p.jsonl:1: expected a JSON object"},
        {"JsonlTruncatedLine", "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"\n",
         "p.jsonl:3: not valid JSON"},
        {"JsonlMissingPrompt", "{\"steps\": 5}\n",
         "p.jsonl:1: missing string \"prompt\""},
        {"JsonlNegativeSteps", "{\"prompt\": \"a\", \"steps\": -5}\n",
         "p.jsonl:1: \"steps\" must be a whole number"},
        {"JsonlStepsAsText", "{\"prompt\": \"a\", \"steps\": \"20\"}\n",
         "p.jsonl:1: \"steps\""},
        {"JsonlScaleNotANumber", "{\"prompt\": \"a\", \"scale\": null}\n",
         "p.jsonl:1: \"scale\" must be a number"},
        {"JsonlZeroNIter", "{\"prompt\": \"a\", \"n_iter\": 0}\n",
         "p.jsonl:1: \"n_iter\""},
        {"JsonlSizeTheModelCannotTake", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"H\": 70}\n",
         "p.jsonl:2: --H 70"},
        {"JsonlUnknownSampler", "{\"prompt\": \"a\", \"sampler\": \"heun9\"}\n",
         "p.jsonl:1: unknown sampler 'heun9'"},
        {"JsonlUnknownSchedule", "{\"prompt\": \"a\", \"sampler\": \"euler\", \"schedule\": \"krras\"}\n",
         "p.jsonl:1: unknown schedule 'krras'"},
        {"JsonlScheduleWithACompvisSampler", "{\"prompt\": \"a\", \"schedule\": \"karras\"}\n",
         "p.jsonl:1: --schedule karras applies to"},
        {"JsonlSeedWithCompvisSeeds", "{\"prompt\": \"a\", \"seed\": 3}\n",
         "p.jsonl:1: \"seed\" needs --seed-mode per-image"},
        {"JsonlNegativeSeed", "{\"prompt\": \"a\", \"seed\": -1}\n",
         "p.jsonl:1: \"seed\"", {"--seed-mode", "per-image"}},
        {"JsonlNulInPrompt", "{\"prompt\": \"a\\u0000b\"}\n",
         "p.jsonl:1: the prompt contains a NUL"},
        {"NonUtf8BytesInJsonl", "{\"prompt\": \"caf\xe9\"}\n",
         "p.jsonl:1: not valid UTF-8"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        expect_input_error(run_jsonl(c.jsonl, c.extra), c.says);
    }
}

TEST(BadBatchInput, NonUtf8BytesInTextFile) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.txt", "fine\ncaf\xe9 au lait\n");
    expect_input_error(sdtest::run(plus(fast_args(dir + "/out"), {"--from-file", dir + "/p.txt"})), "p.txt:2: not valid UTF-8");
}

TEST(BadBatchInput, HundredKilobytePromptInFile) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.txt", "short\n" + std::string(100 * 1024, 'a') + "\n");
    expect_input_error(sdtest::run(plus(fast_args(dir + "/out"), {"--from-file", dir + "/p.txt"})),
                       "p.txt:2: the prompt is 102400 bytes long");
}

TEST(BadBatchInput, HundredKilobytePromptFlag) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", std::string(100 * 1024, 'a')})),
                       "--prompt is 102400 bytes long");
}

TEST(BadBatchInput, ZeroByteFile) {
    const std::string dir = sdtest::temp_dir();
    sdtest::write_text(dir + "/p.txt", "");
    expect_input_error(sdtest::run(plus(fast_args(dir + "/out"), {"--from-file", dir + "/p.txt"})), "p.txt holds no prompts");
}

TEST(BadBatchInput, EmptyStdin) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--from-file", "-"}), ""), "<stdin> holds no prompts");
}

TEST(BadBatchInput, SaveLatentsWithMixedSizes) {
    const std::string dir = sdtest::temp_dir();
    expect_input_error(run_jsonl("{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"W\": 96}\n", {"--save-latents", dir + "/l.npy"}),
                       "p.jsonl:2: --save-latents needs every image the same size");
}

TEST(BadBatchInput, NegativeStepsFlag) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", "a", "--steps", "-5"})), "--steps");
}

TEST(BadBatchInput, UnknownSeedMode) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", "a", "--seed-mode", "random"})),
                       "--seed-mode must be compvis or per-image");
}

TEST(BadBatchInput, ShardNeedsPerImageSeeds) {
    const std::string dir = sdtest::temp_dir();
    expect_input_error(sdtest::run(plus(fast_args(dir + "/out"), {"--from-file", seven_prompts_file(dir), "--shard", "0/2"})),
                       "--shard needs --seed-mode per-image");
}

TEST(BadBatchInput, ShardOutOfRange) {
    const std::string dir = sdtest::temp_dir();
    expect_input_error(sdtest::run(plus(fast_args(dir + "/out"), {"--from-file", seven_prompts_file(dir), "--seed-mode",
                                                                  "per-image", "--shard", "3/3"})),
                       "--shard 3/3: need 0 <= K < N");
}

TEST(BadBatchInput, ShardNotKOverN) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", "a", "--shard", "half"})),
                       "--shard must be K/N");
}

TEST(BadBatchInput, SkipExistingNeedsPerImageSeeds) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", "a", "--skip-existing"})),
                       "--skip-existing needs --seed-mode per-image");
}

TEST(BadBatchInput, NameWithUnknownPlaceholder) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", "a", "--name", "{date}"})),
                       "unknown placeholder {date}");
}

TEST(BadBatchInput, NameGivingTwoImagesOneName) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", "a", "--n_samples", "2", "--name", "{prompt}"})),
                       "gives images 0 and 1 the same name a.png");
}

TEST(BadBatchInput, NameWithSlash) {
    expect_input_error(sdtest::run(plus(fast_args(sdtest::temp_dir()), {"--prompt", "a", "--name", "sub/{index}"})), "without '/'");
}

TEST(BadBatchInput, PromptAndFromFileTogether) {
    const std::string dir = sdtest::temp_dir();
    expect_input_error(sdtest::run(plus(fast_args(dir + "/out"), {"--prompt", "a", "--from-file", seven_prompts_file(dir)})),
                       "either --prompt or --from-file");
}

TEST(BadBatchInput, OutdirIsAFileWithJson) {
    const std::string file = sdtest::temp_dir() + "/a-file";
    sdtest::write_text(file, "x");
    expect_input_error(sdtest::run(plus(fast_args(file), {"--prompt", "a", "--json"})), "a-file is not a folder");
}

TEST(BadBatchInput, UnwritableOutdirWithSkipExisting) {
    expect_input_error(sdtest::run(plus(fast_args("/proc/sd-batch-test"), {"--prompt", "a", "--seed-mode", "per-image", "--skip-existing"})),
                       "/proc/sd-batch-test");
}
