// The entry points of libsd_engine.so, which engine.cpp looks up by name.
#include "sd/engine.h"

extern "C" {

__attribute__((visibility("default"))) int sd_engine_interface_version() { return sd::kEngineInterfaceVersion; }

__attribute__((visibility("default"))) sd::Pipeline* sd_engine_make_pipeline(const sd::PipelineOptions* options) {
    return sd::make_pipeline(*options).release();
}
}
