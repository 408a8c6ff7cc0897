// --shard K/N and --shard auto (from a Slurm job array or a Kubernetes Indexed Job).
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "sd/error.h"
#include "sd/txt2img.h"

namespace sd {

namespace {

// A whole number from an environment variable, or nullopt when it is unset.
std::optional<long long> env_number(const char* name) {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    const std::string text(v);
    size_t used = 0;
    long long n = -1;
    try {
        n = std::stoll(text, &used);
    } catch (const std::logic_error&) {
        used = 0;
    }
    if (used == 0 || used != text.size() || n < 0)
        throw Error(std::string("--shard auto: ") + name + " must be a whole number, got \"" + text + "\"");
    return n;
}

// More shards than this is a mistake (a prompt file holds at most a million prompts).
constexpr long long kMaxShards = 1000000;

// from: the source of K and N; count: the variable N comes from.
Shard checked(long long k, long long n, const std::string& from, const std::string& count) {
    if (n > kMaxShards)
        throw Error("--shard auto: " + count + " gives " + std::to_string(n) + " shards; the limit is " +
                    std::to_string(kMaxShards));
    if (n < 1 || k < 0 || k >= n)
        throw Error("--shard auto: " + from + " gives shard " + std::to_string(k) + "/" + std::to_string(n) +
                    "; need 0 <= K < N");
    return Shard{static_cast<int>(k), static_cast<int>(n)};
}

}  // namespace

Shard shard_from_environment() {
    if (const auto id = env_number("SLURM_ARRAY_TASK_ID")) {
        // A range of task ids (--array=0-7, 1-8, 0-14:2): K counts from the first.
        const long long min = env_number("SLURM_ARRAY_TASK_MIN").value_or(0);
        const long long step = env_number("SLURM_ARRAY_TASK_STEP").value_or(1);
        std::optional<long long> count = env_number("SLURM_ARRAY_TASK_COUNT");
        if (!count) {
            const auto max = env_number("SLURM_ARRAY_TASK_MAX");
            if (!max)
                throw Error(
                    "--shard auto: SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_COUNT nor "
                    "SLURM_ARRAY_TASK_MAX");
            count = (*max - min) / (step > 0 ? step : 1) + 1;
        }
        if (step < 1 || (*id - min) % step != 0)
            throw Error("--shard auto: SLURM_ARRAY_TASK_ID " + std::to_string(*id) +
                        " is not in the array's range (min " + std::to_string(min) + ", step " + std::to_string(step) +
                        ")");
        return checked((*id - min) / step, *count, "the Slurm array", "the Slurm array (SLURM_ARRAY_TASK_COUNT)");
    }
    if (const auto index = env_number("JOB_COMPLETION_INDEX")) {
        const auto count = env_number("SD_SHARD_COUNT");
        if (!count)
            throw Error(
                "--shard auto: JOB_COMPLETION_INDEX is set but SD_SHARD_COUNT is not (set it to the Job's "
                "completions)");
        return checked(*index, *count, "the Indexed Job", "SD_SHARD_COUNT");
    }
    throw Error(
        "--shard auto needs SLURM_ARRAY_TASK_ID (a Slurm job array) or JOB_COMPLETION_INDEX with SD_SHARD_COUNT "
        "(a Kubernetes Indexed Job); neither is set");
}

Shard parse_shard(const std::string& text) {
    if (text == "auto") return shard_from_environment();
    Shard s;
    const size_t slash = text.find('/');
    try {
        size_t used_k = 0, used_n = 0;
        if (slash == std::string::npos) throw std::invalid_argument("no slash");
        s.k = std::stoi(text.substr(0, slash), &used_k);
        s.n = std::stoi(text.substr(slash + 1), &used_n);
        if (used_k != slash || used_n != text.size() - slash - 1) throw std::invalid_argument("trailing text");
    } catch (const std::logic_error&) {
        throw Error("--shard must be K/N (e.g. 0/4) or auto, got \"" + text + "\"");
    }
    if (s.n > kMaxShards) throw Error("--shard " + text + ": N is at most " + std::to_string(kMaxShards));
    if (s.n < 1 || s.k < 0 || s.k >= s.n) throw Error("--shard " + text + ": need 0 <= K < N");
    return s;
}

}  // namespace sd
