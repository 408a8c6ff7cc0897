// The cache the oneDNN-based kernels keep their primitives in (src/kernels/primitive_cache.h).
#include <gtest/gtest.h>

#include <memory>

#include "kernels/primitive_cache.h"

using sd::kernels::PrimitiveCache;

TEST(PrimitiveCache, MakesEachKeyOnceAndKeepsANone) {
    PrimitiveCache<int, int> cache;
    int made = 0;
    auto make = [&](int v) {
        return [&made, v] {
            ++made;
            return v < 0 ? nullptr : std::make_shared<const int>(v);
        };
    };
    const auto a = cache.get(1, make(10));
    EXPECT_EQ(*a, 10);
    EXPECT_EQ(cache.get(1, make(99)), a);  // the first one's, not made again
    EXPECT_EQ(cache.get(2, make(-1)), nullptr);
    EXPECT_EQ(cache.get(2, make(20)), nullptr);  // "none here" is kept, not retried
    EXPECT_EQ(made, 2);
}

TEST(PrimitiveCache, EverNewKeysStartItOverAndHeldValuesSurvive) {
    using Cache = PrimitiveCache<int, int>;
    Cache cache;
    const auto first = cache.get(0, [] { return std::make_shared<const int>(0); });
    for (int k = 1; k < 3 * static_cast<int>(Cache::kMaxEntries); ++k) {
        cache.get(k, [k] { return std::make_shared<const int>(k); });
        EXPECT_LE(cache.size(), Cache::kMaxEntries);
    }
    EXPECT_EQ(*first, 0);  // the caller's reference outlives the entry
    int made = 0;
    cache.get(0, [&] {
        ++made;
        return std::make_shared<const int>(0);
    });
    EXPECT_EQ(made, 1);  // dropped in a start-over, so made again
}
