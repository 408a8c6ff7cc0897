#include "run/model_export.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "io/fs_util.h"
#include "sd/error.h"

#ifndef SD_EXPORT_PYTHON
#define SD_EXPORT_PYTHON "/usr/bin/python3"
#endif
#ifndef SD_EXPORT_PYTHON_DIR
#define SD_EXPORT_PYTHON_DIR ""
#endif

namespace sd {

namespace {

// Exit statuses of the bootstrap below, told apart from the export's own 1 and argparse's 2.
constexpr int kNoTorch = 97;
constexpr int kNoPackage = 98;

// Imports torch first, so that a Python without it is told apart from a failed export.
const char* const kBootstrap = R"(import sys, warnings
warnings.simplefilter("ignore")
try:
    import torch  # noqa: F401
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(97)
sys.path.insert(0, sys.argv[1])
try:
    from sd_export.cli import main
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(98)
sys.exit(main(sys.argv[2:]))
)";

const char* const kSetup =
    "run scripts/setup.sh (it installs Debian's python3-torch), or set SD_PYTHON to a Python 3 "
    "that has PyTorch";

std::string env_or(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
}

// The export's lines as shown: its program name dropped, indentation trimmed.
std::string trimmed(const std::string& line) {
    std::string s = line;
    const std::string prog = "export_model.py: ";
    if (s.rfind(prog, 0) == 0) s.erase(0, prog.size());
    s.erase(0, s.find_first_not_of(' '));
    return s;
}

}  // namespace

std::string export_python() { return env_or("SD_PYTHON", SD_EXPORT_PYTHON); }

std::string export_package_dir() { return env_or("SD_EXPORT_PYTHONPATH", SD_EXPORT_PYTHON_DIR); }

void run_python_export(const std::string& source, const std::string& out, const std::vector<std::string>& args,
                       const std::function<void(const std::string&)>& note, const std::string& shown_as) {
    const std::string python = export_python();
    if (::access(python.c_str(), X_OK) != 0)
        throw Error(shown_as + " is exported once before its first run, which needs Python 3 with PyTorch: " + python +
                    " is missing; " + kSetup);
    const std::string package = export_package_dir();
    if (package.empty() || !file_exists(join_path(package, "sd_export/cli.py")))
        throw Error(shown_as + " is exported once before its first run, by the sd_export package, which is not in '" +
                    package +
                    "': set SD_EXPORT_PYTHONPATH to the folder that holds sd_export/ (python/ of the "
                    "sources)");

    std::vector<std::string> argv = {python, "-c", kBootstrap, package, source, "--out", out};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);

    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw RunFailure(std::string("cannot start the export: ") + std::strerror(errno));
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
        const int err = errno;
        ::close(fds[0]);
        ::close(fds[1]);
        throw RunFailure(std::string("cannot start the export: ") + std::strerror(err));
    }
    if (pid == 0) {
        // Killed with us: a killed run leaves no export writing on behind it.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(127);
        const int null_fd = ::open("/dev/null", O_RDONLY);
        if (null_fd >= 0) ::dup2(null_fd, 0);
        ::dup2(fds[1], 1);  // stdout too: the tool's stdout carries only images
        ::dup2(fds[1], 2);
        ::execv(python.c_str(), cargv.data());
        ::_exit(127);
    }
    ::close(fds[1]);

    // Lines as they come; the error line and argparse's usage text are kept for the message.
    std::string pending, last, error;
    bool in_usage = false;
    auto take_line = [&](const std::string& line) {
        if (line.empty()) return;
        last = line;
        if (line.rfind("usage:", 0) == 0) {
            in_usage = true;
            return;
        }
        if (in_usage && line[0] == ' ') return;
        in_usage = false;
        if (const size_t at = line.find(": error: "); at != std::string::npos) {
            error = line.substr(at + 9);
            return;
        }
        if (note) note("export: " + trimmed(line));
    };
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        pending.append(buf, static_cast<size_t>(n));
        for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
            take_line(pending.substr(0, nl));
            pending.erase(0, nl + 1);
        }
        if (pending.size() > 65536) pending.clear();  // no line is that long; do not grow without end
    }
    take_line(pending);
    ::close(fds[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}

    if (WIFSIGNALED(status))
        throw RunFailure("the export of " + shown_as + " was killed by signal " + std::to_string(WTERMSIG(status)) +
                         (WTERMSIG(status) == SIGKILL ? " (out of memory?)" : "") + "; nothing was cached");
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code == 0) return;
    if (code == 127) throw Error("cannot run " + python + " to export " + shown_as + "; " + kSetup);
    if (code == kNoTorch)
        throw Error(python + " has no PyTorch (" + last + "), which the one-time export of " + shown_as + " needs; " +
                    kSetup);
    if (code == kNoPackage)
        throw Error("the export package sd_export in " + package + " does not load (" + last +
                    "): set SD_EXPORT_PYTHONPATH to the folder that holds sd_export/ (python/ of the sources)");
    throw Error("cannot export " + shown_as + ": " + (error.empty() ? last : error));
}

}  // namespace sd
