#include "runtime.h"

#include <dlfcn.h>

#include <fstream>
#include <string>
#include <thread>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace sd {

void configure_runtime(int threads) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(threads);
    // OpenBLAS keeps its own thread count; find its setter in whatever BLAS
    // LibTorch was linked against (absent for other BLAS implementations).
    using SetThreads = void (*)(int);
    if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
    at::globalContext().setFlushDenormal(true);
}

static long long status_field_kib(const char* field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    const std::string key = std::string(field) + ":";
    while (std::getline(in, line)) {
        if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
    }
    return 0;
}

long long peak_rss_bytes() { return status_field_kib("VmHWM") * 1024; }
long long current_rss_bytes() { return status_field_kib("VmRSS") * 1024; }

}  // namespace sd
