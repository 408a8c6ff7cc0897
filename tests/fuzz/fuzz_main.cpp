// One libFuzzer harness: SD_FUZZ_TARGET names the target of fuzz_targets.h
// (tests/fuzz/CMakeLists.txt builds one executable per target).
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    sdfuzz::SD_FUZZ_TARGET(data, size);
    return 0;
}
