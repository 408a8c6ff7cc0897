// stb_image, compiled once (stb_image_impl.cpp) with only its PNG, JPEG and
// BMP decoders, reading from memory; the few calls io/image_reader.cpp makes.
// Kept in a file of its own so that the build can treat stb_image's code apart
// from ours (CMakeLists.txt: -fwrapv, and the sanitizer builds' exclusions).
#pragma once
#include <cstddef>
#include <cstdint>

namespace sd::stb {

// Every block stb_image asks for on this thread above `bytes` is refused (it
// then fails with "outofmem"): a small picture cannot make it allocate
// more than its header's size allows.
void set_allocation_cap(size_t bytes);

int info(const uint8_t* data, int len, int* w, int* h, int* comp);
bool is_16_bit(const uint8_t* data, int len);
uint8_t* load(const uint8_t* data, int len, int* w, int* h, int* comp, int channels);
uint16_t* load_16(const uint8_t* data, int len, int* w, int* h, int* comp, int channels);
void free_image(void* pixels);
const char* failure_reason();

}  // namespace sd::stb
