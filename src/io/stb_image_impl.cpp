#include "io/stb_image_impl.h"

#include <cstdlib>

// stb_image's only implementation in the program. Every allocation it makes
// goes through capped_realloc: a small PNG whose zlib stream inflates without
// end (stb_image grows its buffer up to 4 GB) fails instead of taking the
// machine's memory.
namespace {
thread_local size_t g_alloc_cap = 0;

void* capped_realloc(void* p, size_t n) {
    if (n > g_alloc_cap) return nullptr;
    return std::realloc(p, n);
}
}  // namespace

#define STBI_MALLOC(n) capped_realloc(nullptr, n)
#define STBI_REALLOC(p, n) capped_realloc(p, n)
#define STBI_FREE(p) std::free(p)
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#include <stb_image.h>

namespace sd::stb {

void set_allocation_cap(size_t bytes) { g_alloc_cap = bytes; }

int info(const uint8_t* data, int len, int* w, int* h, int* comp) {
    return stbi_info_from_memory(data, len, w, h, comp);
}

bool is_16_bit(const uint8_t* data, int len) { return stbi_is_16_bit_from_memory(data, len) != 0; }

uint8_t* load(const uint8_t* data, int len, int* w, int* h, int* comp, int channels) {
    return stbi_load_from_memory(data, len, w, h, comp, channels);
}

uint16_t* load_16(const uint8_t* data, int len, int* w, int* h, int* comp, int channels) {
    return stbi_load_16_from_memory(data, len, w, h, comp, channels);
}

void free_image(void* pixels) { stbi_image_free(pixels); }

const char* failure_reason() { return stbi_failure_reason(); }

}  // namespace sd::stb
