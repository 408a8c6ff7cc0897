#include "engine/block_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

namespace sd {

namespace {

constexpr size_t kLargeBlock = 128 * 1024;  // smaller ones stay with glibc's heap (runtime.cpp's threshold)
constexpr size_t kPage = 4096;
constexpr size_t kHugePage = 2 * 1024 * 1024;

class BlockCache final : public c10::Allocator {
public:
    static BlockCache& instance() {
        static BlockCache* cache = new BlockCache;  // never destroyed: tensors may outlive main()
        return *cache;
    }

    c10::DataPtr allocate(size_t n) const override {
        if (n < kLargeBlock) {
            // Its own deleter: freeing it needs neither the lock nor the lookup.
            void* p = c10::alloc_cpu(n);
            return {p, p, &c10::free_cpu, c10::Device(c10::DeviceType::CPU)};
        }
        const size_t size = (n + kPage - 1) / kPage * kPage;
        auto& self = instance();  // the one cache; allocate() is const in c10's interface
        void* p = self.take(size);
        if (!p) {
            p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            TORCH_CHECK(p != MAP_FAILED, "out of memory: cannot allocate ", size, " bytes");
            // Fewer page faults on first touch where the kernel allows huge pages.
            if (size >= kHugePage) madvise(p, size, MADV_HUGEPAGE);
        }
        std::lock_guard<std::mutex> lock(self.mu_);
        self.live_[p] = size;
        return {p, p, &free_block, c10::Device(c10::DeviceType::CPU)};
    }

    // oneDNN allocates through raw_allocate and frees through this, small and large alike.
    c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

    void set_limit(size_t bytes) {
        std::vector<std::pair<void*, size_t>> drop;
        {
            std::lock_guard<std::mutex> lock(mu_);
            limit_ = bytes;
            drop = take_kept_over(limit_);
        }
        for (auto [p, size] : drop) munmap(p, size);
    }

    void drop_all() {
        std::vector<std::pair<void*, size_t>> drop;
        {
            std::lock_guard<std::mutex> lock(mu_);
            drop = take_kept_over(0);
            peak_cached_ = 0;
        }
        for (auto [p, size] : drop) munmap(p, size);
    }

    BlockCacheStats stats() {
        std::lock_guard<std::mutex> lock(mu_);
        return {hits_, misses_, cached_, peak_cached_};
    }

private:
    static void free_block(void* p) { instance().give_back(p); }

    // Removes kept blocks until at most `keep` bytes remain; the caller unmaps them outside the lock.
    std::vector<std::pair<void*, size_t>> take_kept_over(size_t keep) {
        std::vector<std::pair<void*, size_t>> out;
        for (auto& [size, blocks] : free_) {
            while (cached_ > keep && !blocks.empty()) {
                out.emplace_back(blocks.back(), size);
                blocks.pop_back();
                cached_ -= size;
            }
        }
        return out;
    }

    void* take(size_t size) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = free_.find(size);
        if (it == free_.end() || it->second.empty()) {
            ++misses_;
            return nullptr;
        }
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        ++hits_;
        return p;
    }

    void give_back(void* p) {
        size_t size = 0;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = live_.find(p);
            if (it != live_.end()) {
                size = it->second;
                live_.erase(it);
                if (cached_ + size <= limit_) {
                    free_[size].push_back(p);
                    cached_ += size;
                    peak_cached_ = std::max(peak_cached_, cached_);
                    return;
                }
            }
        }
        if (size == 0)
            c10::free_cpu(p);  // a small block (raw_deallocate), from glibc's heap
        else
            munmap(p, size);
    }

    std::mutex mu_;
    std::unordered_map<void*, size_t> live_;               // large blocks in use, by address
    std::unordered_map<size_t, std::vector<void*>> free_;  // kept blocks, by size
    size_t limit_ = 0, cached_ = 0, peak_cached_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace

void install_block_cache() {
    static std::once_flag once;
    // Priority 1 outranks LibTorch's own CPU allocator (registered at 0).
    std::call_once(once, [] { c10::SetCPUAllocator(&BlockCache::instance(), 1); });
}

void set_block_cache_limit(size_t bytes) { BlockCache::instance().set_limit(bytes); }

void drop_cached_blocks() { BlockCache::instance().drop_all(); }

BlockCacheStats block_cache_stats() { return BlockCache::instance().stats(); }

}  // namespace sd
