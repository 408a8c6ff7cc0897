#include "engine/samplers/sampler_run.h"

namespace sd {

AfterStep blend_after(const SamplerRun& r, std::function<at::Tensor(int i)> noised_after) {
    if (!r.mask.defined()) return nullptr;
    return [&r, noised_after = std::move(noised_after)](int i, int total, at::Tensor x) {
        at::Tensor proper = i + 1 < total ? noised_after(i) : r.x0;
        return (1 - r.mask) * proper + r.mask * x;
    };
}

}  // namespace sd
