#include "engine/runtime.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include "engine/block_cache.h"
#include "io/cgroups.h"
#include "io/fs_util.h"
#include "memory/memory_budget.h"

namespace sd {

void configure_runtime(int threads) {
    // One per CPU the process may use, not per CPU of the machine: in a Slurm job
    // or a container those can be 2 of 64.
    if (threads <= 0) threads = usable_cpus();
    at::set_num_threads(threads);
    // OpenBLAS keeps its own thread count; find its setter in whatever BLAS
    // LibTorch was linked against (absent for other BLAS implementations).
    using SetThreads = void (*)(int);
    if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
    at::globalContext().setFlushDenormal(true);
    // glibc raises its mmap threshold as large blocks are freed (up to 32 MiB),
    // after which the UNet's activations come from the heap, fragment it and
    // stay resident: measured +565 MiB peak and +450 MiB kept after one
    // 256x256 UNet pass, against +190 / +63 MiB with a fixed threshold.
    // (LibTorch's own large blocks now bypass glibc: block_cache.h.)
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    // TorchScript's profiling executor re-optimises each module on its second
    // call: measured on the full-size UNet at 256x256, that call took 18 s more
    // and left +140 MiB resident for the rest of the run, for no faster steps
    // afterwards (CPU fusion is off in LibTorch 1.13). Run the graphs as written.
    torch::jit::setGraphExecutorOptimize(false);
    // LibTorch's large CPU blocks then come from a cache the memory plan sizes.
    install_block_cache();
}

static long long status_bytes(const char* field) {
    return static_cast<long long>(kib_field(read_kernel_text("/proc/self/status"), field).value_or(0));
}

bool reset_peak_rss() {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
    out.flush();
    return static_cast<bool>(out);
}

void release_free_memory() { malloc_trim(0); }

long long peak_rss_bytes() { return status_bytes("VmHWM"); }
long long current_rss_bytes() { return status_bytes("VmRSS"); }

double seconds_since_process_start() {
    // Field 22 of /proc/self/stat: start time in clock ticks after boot; the
    // command name (field 2) may hold spaces, so count from its closing ')'.
    std::ifstream stat("/proc/self/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');
    std::ifstream uptime_file("/proc/uptime");
    double uptime = 0;
    if (close == std::string::npos || !(uptime_file >> uptime)) return 0;
    std::istringstream fields(text.substr(close + 2));
    std::string field;
    for (int i = 3; i < 22 && fields >> field; ++i) {}
    unsigned long long start_ticks = 0;
    if (!(fields >> start_ticks)) return 0;
    return uptime - static_cast<double>(start_ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

StageMeter::StageMeter(bool measure) : measure_(measure) {
    if (measure_) reset_peak_rss();
}

void StageMeter::end(long long& peak, long long& kept) const {
    peak = measure_ ? peak_rss_bytes() : 0;
    kept = static_cast<long long>(block_cache_stats().peak_cached_bytes);
    drop_cached_blocks();
}

}  // namespace sd
