// --model FILE (issue 36): a checkpoint exported once into the model cache,
// then run from there. Every test has a cache folder of its own.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io/png_text.h"
#include "io/sha256.h"
#include "test_util.h"

namespace fs = std::filesystem;
using sdtest::run;

namespace {

std::string tiny() { return sdtest::fixtures() + "/tiny/tiny.safetensors"; }

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string parameters_of(const std::string& png) {
    const std::string bytes = read_bytes(png);
    return sd::png_read_text(std::vector<uint8_t>(bytes.begin(), bytes.end()))["parameters"];
}

// A small run of --model MODEL with the cache in CACHE, its image in OUT.
std::vector<std::string> run_args(const std::string& model, const std::string& cache, const std::string& out) {
    return {sdtest::cli(),   "--model",   model,     "--model-cache", cache, "--outdir", out, "--prompt",
            "a red circle", "--steps",   "2",       "--threads",     "1",   "--seed",   "7"};
}

std::vector<std::string> with_env(const std::string& assignment, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"/usr/bin/env", assignment});
    return argv;
}

int count(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

// The cache's complete entries (folders named HASH-VERSION[-ARGS]) and its other names.
std::vector<std::string> entries(const std::string& cache) {
    std::vector<std::string> out;
    if (!fs::exists(cache)) return out;
    for (const auto& e : fs::directory_iterator(cache)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.find('.') == std::string::npos) out.push_back(n);
    }
    return out;
}

// The run as a child of ours, its stdout and stderr into files.
pid_t start(const std::vector<std::string>& argv, const std::string& out_file, const std::string& err_file) {
    const pid_t pid = fork();
    if (pid == 0) {
        const int out = open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int err = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        dup2(err, 2);
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    return pid;
}

int wait_for(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The image --model on the exported folder (build/test-models/tiny-st) gives.
std::string reference_image(const std::string& dir) {
    auto r = run(run_args(sdtest::test_models() + "/tiny-st", dir + "/unused-cache", dir + "/ref"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(fs::exists(dir + "/unused-cache")) << "an exported folder needs no cache";
    return read_bytes(dir + "/ref/00000.png");
}

}  // namespace

// The acceptance case: tiny.safetensors with its yaml and text config through its side
// file (tests/fixtures/tiny/tiny.export.json). The first run exports with progress, the
// second starts from the cache without Python; both give the exported folder's bytes.
TEST(ModelCache, CheckpointIsExportedOnceThenRunFromTheCache) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    ASSERT_TRUE(fs::exists(sdtest::fixtures() + "/tiny/tiny.export.json"));
    const std::string want = reference_image(dir);

    auto first = run(run_args(tiny(), cache, dir + "/o1"));
    ASSERT_EQ(first.exit_code, 0) << first.err;
    EXPECT_EQ(count(first.err, "sd-txt2img: exporting " + tiny() + " into the model cache"), 1) << first.err;
    EXPECT_NE(first.err.find("export: unet.weights"), std::string::npos) << first.err;  // the export's progress
    EXPECT_EQ(sdtest::lines(first.out), std::vector<std::string>{dir + "/o1/00000.png"});  // stdout: images only
    ASSERT_EQ(entries(cache).size(), 1u);

    // No Python can run now: the second run must not need it.
    auto second = run(with_env("SD_PYTHON=/nonexistent/python3", run_args(tiny(), cache, dir + "/o2")));
    ASSERT_EQ(second.exit_code, 0) << second.err;
    EXPECT_EQ(second.err.find("export"), std::string::npos) << second.err;
    EXPECT_TRUE(read_bytes(dir + "/o1/00000.png") == want) << "images differ";
    EXPECT_TRUE(read_bytes(dir + "/o2/00000.png") == want) << "images differ";

    // The PNG's Model hash is the checkpoint's own A1111 short hash.
    const auto text = parameters_of(dir + "/o2/00000.png");
    EXPECT_NE(text.find(", Model hash: " + sd::sha256_file_hex(tiny()).substr(0, 10) + ", Model: tiny,"),
              std::string::npos)
        << text;

    // --model-cache-list names the entry, its hash and the source; --model-cache-clear empties it.
    auto list = run({sdtest::cli(), "--model-cache", cache, "--model-cache-list"});
    ASSERT_EQ(list.exit_code, 0) << list.err;
    ASSERT_EQ(sdtest::lines(list.out).size(), 1u) << list.out;
    EXPECT_EQ(list.out.rfind(cache + "/" + entries(cache)[0] + "\t", 0), 0u) << list.out;
    EXPECT_NE(list.out.find(sd::sha256_file_hex(tiny()).substr(0, 10)), std::string::npos) << list.out;
    EXPECT_NE(list.out.find(fs::canonical(tiny()).string()), std::string::npos) << list.out;
    auto clear = run({sdtest::cli(), "--model-cache", cache, "--model-cache-clear"});
    ASSERT_EQ(clear.exit_code, 0) << clear.err;
    EXPECT_NE(clear.err.find("removed 1 entry"), std::string::npos) << clear.err;
    EXPECT_TRUE(entries(cache).empty());
    EXPECT_EQ(run({sdtest::cli(), "--model-cache", cache, "--model-cache-list"}).out, "");
}

// The same checkpoint with its configs through --export-arg instead (a copy without a
// side file): the same image, and a flag the export does not know is one line.
TEST(ModelCache, ExportArgumentsFromTheCommandLine) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    fs::create_directory(dir + "/copy");
    fs::copy_file(tiny(), dir + "/copy/tiny.safetensors");
    const std::string fx = sdtest::fixtures() + "/tiny/";
    auto args = run_args(dir + "/copy/tiny.safetensors", cache, dir + "/o");
    args.insert(args.end(), {"--export-arg=--config=" + fx + "v1-tiny.yaml", "--export-arg",
                             "--text-config=" + fx + "text_encoder.json"});
    auto r = run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(read_bytes(dir + "/o/00000.png") == reference_image(dir)) << "images differ";

    auto bad = run({sdtest::cli(), "--model", dir + "/copy/tiny.safetensors", "--model-cache", cache, "--prompt", "x",
                    "--export-arg=--no-such-flag"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("sd-txt2img: error: cannot export " + dir + "/copy/tiny.safetensors: unrecognized arguments: "
                           "--no-such-flag\n"),
              std::string::npos)
        << bad.err;
    EXPECT_EQ(count(bad.err, "error"), 1) << bad.err;
    auto out = run({sdtest::cli(), "--model", dir + "/copy/tiny.safetensors", "--model-cache", cache, "--prompt", "x",
                    "--export-arg=--out=/tmp/x"});
    EXPECT_EQ(out.exit_code, 1);
    EXPECT_NE(out.err.find("--export-arg: --out is the cache's to set"), std::string::npos) << out.err;
}

// A q8_0 GGUF file (the conformance fixture, copied beside a side file with the tiny
// model's configs) is exported with --dtype auto: the entry keeps its UNet in 8-bit blocks
// (model.json dtype q8_0, I8 weights), and --dtype float32 given makes a float entry.
TEST(ModelCache, QuantizedGgufStaysEightBit) {
    const std::string gguf = sdtest::fixtures() + "/../../../shared/conformance/gguf/tiny-q8_0.gguf";
    if (!fs::exists(gguf)) GTEST_SKIP() << "no ../shared/conformance/gguf next to the checkout";
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache", fx = sdtest::fixtures() + "/tiny/";
    fs::create_directory(dir + "/src");
    fs::copy_file(gguf, dir + "/src/tiny-q8_0.gguf");
    std::ofstream(dir + "/src/tiny-q8_0.export.json")
        << "{\"config\": \"" << fx << "v1-tiny.yaml\", \"text-config\": \"" << fx << "text_encoder.json\"}";
    auto r = run(run_args(dir + "/src/tiny-q8_0.gguf", cache, dir + "/o"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(entries(cache).size(), 1u);
    const std::string entry = cache + "/" + entries(cache)[0];
    EXPECT_NE(read_bytes(entry + "/model.json").find("\"dtype\": \"q8_0\""), std::string::npos);
    EXPECT_NE(read_bytes(entry + "/unet.weights").find("\"dtype\":\"I8\""), std::string::npos);
    EXPECT_LT(fs::file_size(entry + "/unet.weights"), fs::file_size(gguf) / 4) << "the UNet of a 15 MB model";

    auto args = run_args(dir + "/src/tiny-q8_0.gguf", cache, dir + "/o2");
    args.push_back("--export-arg=--dtype=float32");
    auto f32 = run(args);
    ASSERT_EQ(f32.exit_code, 0) << f32.err;
    ASSERT_EQ(entries(cache).size(), 2u);
    for (const auto& e : entries(cache))
        if (cache + "/" + e != entry)
            EXPECT_NE(read_bytes(cache + "/" + e + "/model.json").find("\"dtype\": \"float32\""), std::string::npos);
}

// A diffusers folder goes through the cache too (the SDXL fixture's): exported once,
// then run without Python, the same bytes both times.
TEST(ModelCache, DiffusersFolderIsExportedOnce) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    const std::string folder = sdtest::fixtures() + "/sdxl-tiny/diffusers";
    auto first = run(run_args(folder, cache, dir + "/o1"));
    ASSERT_EQ(first.exit_code, 0) << first.err;
    EXPECT_EQ(count(first.err, "sd-txt2img: exporting " + folder + " into the model cache"), 1) << first.err;
    auto second = run(with_env("SD_PYTHON=/nonexistent/python3", run_args(folder + "/", cache, dir + "/o2")));
    ASSERT_EQ(second.exit_code, 0) << second.err;
    EXPECT_EQ(entries(cache).size(), 1u);
    EXPECT_TRUE(read_bytes(dir + "/o1/00000.png") == read_bytes(dir + "/o2/00000.png")) << "images differ";
    const auto text = parameters_of(dir + "/o2/00000.png");
    EXPECT_NE(text.find(", Model: diffusers,"), std::string::npos) << text;
    EXPECT_EQ(text.find("Model hash"), std::string::npos) << text;  // no one file to hash

    // --export-arg is for a checkpoint, not an exported folder.
    auto r = run({sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--prompt", "x", "--export-arg=--dtype"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--export-arg applies to a checkpoint's export"), std::string::npos) << r.err;
}

// A run killed during its export leaves no entry that a later run would use: the next
// one exports again and gives the right image.
TEST(ModelCache, KillDuringExportLeavesNoUsableEntry) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    const pid_t pid = start(run_args(tiny(), cache, dir + "/o1"), dir + "/out1", dir + "/err1");
    // Killed once the export has written into its temporary folder.
    bool writing = false;
    for (int i = 0; i < 60000 && !writing; ++i) {
        if (fs::exists(cache))
            for (const auto& e : fs::directory_iterator(cache))
                if (e.is_directory() && e.path().filename().string().find(".tmp-") != std::string::npos &&
                    !fs::is_empty(e.path()))
                    writing = true;
        if (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        int status;
        if (!writing && waitpid(pid, &status, WNOHANG) == pid) FAIL() << "the run ended before it was killed";
    }
    ASSERT_TRUE(writing);
    kill(pid, SIGKILL);
    EXPECT_EQ(wait_for(pid), 128 + SIGKILL);
    // The export dies with it (PR_SET_PDEATHSIG): no process is left writing into the cache.
    bool export_alive = true;
    for (int i = 0; i < 100 && export_alive; ++i) {  // at most 1 s: an orphan export would run on for seconds
        export_alive = false;
        for (const auto& p : fs::directory_iterator("/proc"))
            if (std::isdigit(static_cast<unsigned char>(p.path().filename().string()[0])) &&
                read_bytes(p.path().string() + "/cmdline").find(cache) != std::string::npos)
                export_alive = true;
        if (export_alive) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_FALSE(export_alive) << "the export outlived the killed run";
    EXPECT_TRUE(entries(cache).empty());

    auto again = run(run_args(tiny(), cache, dir + "/o2"));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(count(again.err, "sd-txt2img: exporting"), 1) << again.err;
    EXPECT_TRUE(read_bytes(dir + "/o2/00000.png") == reference_image(dir)) << "images differ";
    for (const auto& e : fs::directory_iterator(cache))  // the leftover was removed
        EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// Two first runs at once: one exports, the other waits for it; both give the same image.
TEST(ModelCache, TwoConcurrentFirstRunsExportOnce) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    const pid_t a = start(run_args(tiny(), cache, dir + "/oa"), dir + "/outa", dir + "/erra");
    const pid_t b = start(run_args(tiny(), cache, dir + "/ob"), dir + "/outb", dir + "/errb");
    const int code_a = wait_for(a), code_b = wait_for(b);
    const std::string err = sdtest::read_text(dir + "/erra") + sdtest::read_text(dir + "/errb");
    ASSERT_EQ(code_a, 0) << err;
    ASSERT_EQ(code_b, 0) << err;
    EXPECT_EQ(count(err, "sd-txt2img: exporting"), 1) << err;
    EXPECT_EQ(count(err, "export: exported tiny.safetensors"), 1) << err;
    EXPECT_EQ(entries(cache).size(), 1u);
    const std::string want = reference_image(dir);
    EXPECT_TRUE(read_bytes(dir + "/oa/00000.png") == want) << "images differ";
    EXPECT_TRUE(read_bytes(dir + "/ob/00000.png") == want) << "images differ";
}

// A checkpoint changed in place is exported again (a new entry, its own hash), not
// served from the entry of its old content.
TEST(ModelCache, ChangedSourceIsExportedAgain) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    const std::string ckpt = dir + "/model.safetensors";
    fs::copy_file(tiny(), ckpt);
    const std::string fx = sdtest::fixtures() + "/tiny/";
    sdtest::write_text(dir + "/model.export.json",
                       "{\"config\": \"" + fx + "v1-tiny.yaml\", \"text_config\": \"" + fx + "text_encoder.json\"}");
    auto first = run(run_args(ckpt, cache, dir + "/o1"));
    ASSERT_EQ(first.exit_code, 0) << first.err;
    const std::string old_hash = sd::sha256_file_hex(ckpt);

    // The last bytes belong to a weight: another value, same size.
    {
        std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-2, std::ios::end);
        f.put('\x3f');
        f.put('\x3f');
    }
    const std::string new_hash = sd::sha256_file_hex(ckpt);
    ASSERT_NE(new_hash, old_hash);
    // A later mtime than the first run's, whatever the clock's grain.
    fs::last_write_time(ckpt, fs::last_write_time(ckpt) + std::chrono::seconds(5));

    auto second = run(run_args(ckpt, cache, dir + "/o2"));
    ASSERT_EQ(second.exit_code, 0) << second.err;
    EXPECT_EQ(count(second.err, "sd-txt2img: exporting"), 1) << second.err;
    EXPECT_EQ(entries(cache).size(), 2u);
    const auto text = parameters_of(dir + "/o2/00000.png");
    EXPECT_NE(text.find("Model hash: " + new_hash.substr(0, 10) + ", Model: model,"), std::string::npos) << text;
    EXPECT_TRUE(read_bytes(dir + "/o1/00000.png") != read_bytes(dir + "/o2/00000.png"));

    // And a third run of the changed file starts from its new entry.
    auto third = run(with_env("SD_PYTHON=/nonexistent/python3", run_args(ckpt, cache, dir + "/o3")));
    ASSERT_EQ(third.exit_code, 0) << third.err;
    EXPECT_TRUE(read_bytes(dir + "/o3/00000.png") == read_bytes(dir + "/o2/00000.png")) << "images differ";
}

// Without Python or PyTorch the first run is one line saying what to install.
TEST(ModelCache, MissingPythonOrTorchIsOneLineNamingSetup) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    auto none = run(with_env("SD_PYTHON=" + dir + "/no-python", run_args(tiny(), cache, dir + "/o")));
    EXPECT_EQ(none.exit_code, 1);
    EXPECT_NE(none.err.find("needs Python 3 with PyTorch: " + dir + "/no-python is missing; run scripts/setup.sh"),
              std::string::npos)
        << none.err;
    EXPECT_EQ(count(none.err, "\n"), 2) << none.err;  // the "exporting" note and the error

    // A Python without torch: Debian's, with the import of torch made to fail.
    const std::string fake = dir + "/python-without-torch";
    sdtest::write_text(fake,
                       "#!/bin/sh\nshift\nboot=\"$1\"\nshift\n"
                       "exec /usr/bin/python3 -c \"import sys; sys.modules['torch'] = None; exec(sys.argv.pop(1))\" "
                       "\"$boot\" \"$@\"\n");
    fs::permissions(fake, fs::perms::owner_all);
    auto no_torch = run(with_env("SD_PYTHON=" + fake, run_args(tiny(), cache, dir + "/o")));
    EXPECT_EQ(no_torch.exit_code, 1);
    EXPECT_NE(no_torch.err.find("sd-txt2img: error: " + fake + " has no PyTorch"), std::string::npos) << no_torch.err;
    EXPECT_NE(no_torch.err.find("run scripts/setup.sh"), std::string::npos) << no_torch.err;
    EXPECT_TRUE(entries(cache).empty());
    EXPECT_FALSE(fs::exists(dir + "/o/00000.png"));
}

// Bad --model paths and side files: one line naming the file.
TEST(ModelCache, BadSourcesAndSideFilesAreOneLine) {
    const std::string dir = sdtest::temp_dir(), cache = dir + "/cache";
    sdtest::write_text(dir + "/notes.txt", "hello");
    auto r = run(run_args(dir + "/notes.txt", cache, dir + "/o"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "sd-txt2img: error: --model " + dir +
                         "/notes.txt is not a model: give an exported folder (model.json), a checkpoint "
                         "(.safetensors, .ckpt, .gguf) or a diffusers folder (model_index.json)\n");
    r = run(run_args(dir + "/missing.safetensors", cache, dir + "/o"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "sd-txt2img: error: --model " + dir + "/missing.safetensors does not exist\n");

    fs::copy_file(tiny(), dir + "/m.safetensors");
    sdtest::write_text(dir + "/m.export.json", "{\"config\": ");
    r = run(run_args(dir + "/m.safetensors", cache, dir + "/o"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err.rfind("sd-txt2img: error: " + dir + "/m.export.json: not valid JSON", 0), 0u) << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1) << r.err;
    sdtest::write_text(dir + "/m.export.json", "{\"out\": \"/tmp/elsewhere\"}");
    r = run(run_args(dir + "/m.safetensors", cache, dir + "/o"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(dir + "/m.export.json: --out is the cache's to set"), std::string::npos) << r.err;
    EXPECT_TRUE(entries(cache).empty());
}
