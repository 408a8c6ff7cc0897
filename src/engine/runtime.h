// Process-wide settings for LibTorch on this machine: threads, denormals, memory
// measurements (OpenMP's wait policy is set before LibTorch loads: engine.h).
#pragma once
#include <chrono>

namespace sd {

// Sets LibTorch's intra-op threads and OpenBLAS's threads (LibTorch does not
// forward its setting to OpenBLAS) and flushes denormals (random-weight and
// real models both produce them late in sampling, where they cost 10-100x).
// threads <= 0 means one per CPU the process may use (io/cgroups.h usable_cpus).
void configure_runtime(int threads);

// Peak resident set size of this process so far, in bytes (from /proc).
long long peak_rss_bytes();

// Current resident set size in bytes.
long long current_rss_bytes();

// Starts a new peak: afterwards peak_rss_bytes() reports the peak since this
// call (Linux: /proc/self/clear_refs). Returns false where unsupported.
bool reset_peak_rss();

// Hands freed heap memory back to the OS (glibc keeps it otherwise).
void release_free_memory();

// Seconds since this process started (Linux: /proc/self/stat), so that
// start-up costs before main() count too.
double seconds_since_process_start();

// Seconds from `start` to now.
double seconds_since(std::chrono::steady_clock::time_point start);

// One stage's measurements: its peak RSS (when measure is set; resetting the
// kernel's counter on construction) and the most freed bytes the allocator
// kept for reuse. Each stage frees the last one's kept blocks: they are of other sizes.
class StageMeter {
public:
    explicit StageMeter(bool measure);
    void end(long long& peak, long long& kept) const;

private:
    bool measure_;
};

}  // namespace sd
