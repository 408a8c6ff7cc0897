// Memory models the planner tests share (memory/planner.h).
#pragma once
#include "memory/planner.h"

namespace sdtest {

// The full-size SD 1.5 architecture, with the file sizes of a float32 export.
sd::MemoryModel sd15_memory_model();

}  // namespace sdtest
