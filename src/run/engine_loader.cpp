#include "sd/engine.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "sd/error.h"

namespace sd {

namespace {

// This executable's own path, resolved, or empty.
std::string own_path() {
    char buf[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

void use_passive_openmp() {
    // libgomp reads the variable once, when it loads: with the engine module
    // (LibTorch), which load_pipeline opens later, so setting it here is enough.
    if (!std::getenv("OMP_WAIT_POLICY")) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
}

void use_openblas_kernels_for_this_cpu() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (avx512 && !std::getenv("OPENBLAS_CORETYPE")) setenv("OPENBLAS_CORETYPE", "SKYLAKEX", 1);
#endif
}

std::unique_ptr<Pipeline> load_pipeline(const PipelineOptions& options) {
    using Version = int (*)();
    using Make = Pipeline* (*)(const PipelineOptions*);
    static Make make = [] {
        const std::string self = own_path();
        const std::string path = self.substr(0, self.find_last_of('/') + 1) + "libsd_engine.so";
        void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) throw Error(std::string("cannot load the engine module: ") + dlerror());
        auto version = reinterpret_cast<Version>(dlsym(lib, "sd_engine_interface_version"));
        auto fn = reinterpret_cast<Make>(dlsym(lib, "sd_engine_make_pipeline"));
        if (!version || !fn || version() != kEngineInterfaceVersion)
            throw Error(path + " is from another build of sd-txt2img (rebuild both)");
        return fn;  // never unloaded: LibTorch stays until the process ends
    }();
    return std::unique_ptr<Pipeline>(make(&options));
}

}  // namespace sd
