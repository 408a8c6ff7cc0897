// The entry points of libsd_engine.so, which src/run/engine_loader.cpp looks up by name.
#include "engine/blocked_operators.h"
#include "engine/operators.h"
#include "sd/engine.h"

// Loading this library registers sd::attention, so that Python can run the
// exported modules with the C++ kernel (torch.ops.load_library; bench/bench_speed.py).
[[maybe_unused]] static const bool kOperatorsRegistered = (sd::register_operators(), true);
// And sd_blocked::*, the blocked ResNet blocks (src/engine/blocked_operators.h).
[[maybe_unused]] static const bool kBlockedRegistered = (sd::register_blocked_operators(), true);

extern "C" {

__attribute__((visibility("default"))) int sd_engine_interface_version() { return sd::kEngineInterfaceVersion; }

__attribute__((visibility("default"))) sd::Pipeline* sd_engine_make_pipeline(const sd::PipelineOptions* options) {
    return sd::make_pipeline(*options).release();
}
}
