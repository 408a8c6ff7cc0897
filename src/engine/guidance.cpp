#include "engine/guidance.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace sd {

at::Tensor guide(const at::Tensor& uncond_out, const at::Tensor& cond_out, double scale) {
    return uncond_out + scale * (cond_out - uncond_out);
}

Guidance::Guidance(UnetFn unet, const UnetConditioning& text, double scale, int64_t rows_per_pass)
    : unet_(std::move(unet)), scale_(scale), rows_per_pass_(rows_per_pass), guided_(text.uncond.defined()) {
    context_ = guided_ ? at::cat({text.uncond, text.cond}) : text.cond;
    // SDXL's vector input, in the same row order as the context.
    if (text.cond_y.defined()) y_ = guided_ ? at::cat({text.uncond_y, text.cond_y}) : text.cond_y;
    if (text.concat.defined()) concat_ = guided_ ? at::cat({text.concat, text.concat}) : text.concat;
}

at::Tensor Guidance::run(const at::Tensor& x, const at::Tensor& t) const {
    const int64_t n = x.size(0);
    auto pass = [&](int64_t i, int64_t e) {
        const at::Tensor xs =
            concat_.defined() ? at::cat({x.slice(0, i, e), concat_.slice(0, i, e)}, 1) : x.slice(0, i, e);
        return unet_(xs, t.slice(0, i, e), context_.slice(0, i, e), y_.defined() ? y_.slice(0, i, e) : at::Tensor());
    };
    if (n <= rows_per_pass_) return pass(0, n);
    std::vector<at::Tensor> parts;
    for (int64_t i = 0; i < n; i += rows_per_pass_) parts.push_back(pass(i, std::min(n, i + rows_per_pass_)));
    return at::cat(parts);
}

at::Tensor Guidance::operator()(const at::Tensor& x, const at::Tensor& t) {
    ++evaluations_;
    rows_ += x.size(0) * (guided_ ? 2 : 1);
    if (!guided_) return run(x, t);
    auto parts = run(at::cat({x, x}), at::cat({t, t})).chunk(2);
    return guide(parts[0], parts[1], scale_);
}

}  // namespace sd
