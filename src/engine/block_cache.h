// LibTorch's CPU allocator, replaced by one that keeps freed large blocks for
// reuse. A sampler step allocates the same tensor sizes as the step before, so
// a block freed in one layer is handed to the next that asks for its size,
// instead of the kernel zeroing fresh pages for every activation. The kept
// bytes are capped (the memory plan's headroom): with a cap of 0 every large
// block goes straight back to the OS, as glibc does with its fixed mmap
// threshold (runtime.cpp).
#pragma once
#include <cstddef>

namespace sd {

struct BlockCacheStats {
    size_t hits = 0, misses = 0;   // large allocations served from the cache / by mmap
    size_t cached_bytes = 0;       // freed bytes kept now
    size_t peak_cached_bytes = 0;  // most kept at once since the last drop_cached_blocks()
};

// Makes the cache LibTorch's CPU allocator (once per process; later calls do nothing).
void install_block_cache();

// At most `bytes` of freed blocks are kept; what exceeds it is returned to the OS now.
void set_block_cache_limit(size_t bytes);

// Returns every kept block to the OS. Called between stages: the next stage
// asks for other sizes, so the last one's blocks would only sit there.
void drop_cached_blocks();

BlockCacheStats block_cache_stats();

}  // namespace sd
