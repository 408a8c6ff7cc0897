// The cache each oneDNN-based kernel keeps its primitives in; plain C++, so
// that it is testable without oneDNN.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace sd::kernels {

// Primitives cost far more to make than a small one takes to run, and a run uses
// a few dozen shapes (each layer's, at one or two image sizes). A long batch of
// ever-new sizes starts over past kMaxEntries: callers hold their own reference.
template <typename Key, typename Value>
class PrimitiveCache {
public:
    static constexpr size_t kMaxEntries = 512;

    // The value for key, made by make() (a shared_ptr<const Value>, null for "none
    // here", which is kept too) the first time; make() runs under the lock.
    template <typename Make>
    std::shared_ptr<const Value> get(const Key& key, Make&& make) {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = entries_.find(key); it != entries_.end()) return it->second;
        if (entries_.size() >= kMaxEntries) entries_.clear();
        std::shared_ptr<const Value> made = make();
        entries_.emplace(key, made);
        return made;
    }

    size_t size() {
        std::lock_guard<std::mutex> lock(mu_);
        return entries_.size();
    }

private:
    std::mutex mu_;
    std::map<Key, std::shared_ptr<const Value>> entries_;
};

}  // namespace sd::kernels
