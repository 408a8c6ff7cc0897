#include "engine/guidance.h"

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

namespace sd {

at::Tensor guide(const at::Tensor& uncond_out, const at::Tensor& cond_out, double scale) {
    return uncond_out + scale * (cond_out - uncond_out);
}

Guidance::Guidance(UnetFn unet, const UnetConditioning& text, double scale, int64_t rows_per_pass)
    : Guidance(std::move(unet), TextSchedule{{text}, {{0, 0}}}, text.concat, scale, rows_per_pass) {}

Guidance::Guidance(UnetFn unet, const TextSchedule& text, const at::Tensor& concat, double scale, int64_t rows_per_pass)
    : unet_(std::move(unet)),
      texts_(text.texts),
      spans_(text.spans),
      parts_(text.parts),
      scale_(scale),
      rows_per_pass_(rows_per_pass),
      guided_(text.texts.at(0).uncond.defined()) {
    if (spans_.empty()) throw std::logic_error("Guidance: a text schedule without spans");
    if (!parts_.empty() && !guided_)
        throw std::logic_error("Guidance: composed prompts without the unconditional side");
    if (!parts_.empty()) {
        std::vector<int64_t> images;
        for (const auto& p : parts_) images.push_back(p.image);
        part_images_ = at::tensor(images, at::kLong);
    }
    if (concat.defined())
        concat_ = !guided_         ? concat
                  : parts_.empty() ? at::cat({concat, concat})
                                   : at::cat({concat, concat.index_select(0, part_images_.to(concat.device()))});
}

Guidance::Context Guidance::current() const {
    // A1111's reconstruct_cond_batch: the first span whose last call is not before this one.
    size_t text = spans_.back().text;
    for (const auto& span : spans_)
        if (evaluations_ <= span.last_call) {
            text = span.text;
            break;
        }
    const UnetConditioning& c = texts_.at(text);
    Context ctx;
    ctx.context = guided_ ? at::cat({c.uncond, c.cond}) : c.cond;
    // SDXL's vector input, in the same row order as the context.
    if (c.cond_y.defined()) ctx.y = guided_ ? at::cat({c.uncond_y, c.cond_y}) : c.cond_y;
    return ctx;
}

at::Tensor Guidance::run(const at::Tensor& x, const at::Tensor& t, const Context& c) const {
    const int64_t n = x.size(0);
    auto pass = [&](int64_t i, int64_t e) {
        const at::Tensor xs =
            concat_.defined() ? at::cat({x.slice(0, i, e), concat_.slice(0, i, e)}, 1) : x.slice(0, i, e);
        return unet_(xs, t.slice(0, i, e), c.context.slice(0, i, e), c.y.defined() ? c.y.slice(0, i, e) : at::Tensor());
    };
    if (n <= rows_per_pass_) return pass(0, n);
    std::vector<at::Tensor> parts;
    for (int64_t i = 0; i < n; i += rows_per_pass_) parts.push_back(pass(i, std::min(n, i + rows_per_pass_)));
    return at::cat(parts);
}

at::Tensor Guidance::operator()(const at::Tensor& x, const at::Tensor& t) {
    const Context c = current();
    ++evaluations_;
    if (!parts_.empty()) {
        // A1111's combine_denoised: the unconditional rows first, then each part's, its image's
        // x repeated; each part adds weight * scale times its difference from its image's e_u.
        const int64_t n = x.size(0);
        const at::Tensor images = part_images_.to(x.device());
        rows_ += n + static_cast<int64_t>(parts_.size());
        const at::Tensor out = run(at::cat({x, x.index_select(0, images)}), at::cat({t, t.index_select(0, images)}), c);
        const at::Tensor e_u = out.slice(0, 0, n);
        at::Tensor guided = e_u.clone();
        for (size_t j = 0; j < parts_.size(); ++j) {
            const int64_t i = parts_[j].image;
            guided[i] += (out[n + static_cast<int64_t>(j)] - e_u[i]) * (parts_[j].weight * scale_);
        }
        return guided;
    }
    rows_ += x.size(0) * (guided_ ? 2 : 1);
    if (!guided_) return run(x, t, c);
    auto parts = run(at::cat({x, x}), at::cat({t, t}), c).chunk(2);
    return guide(parts[0], parts[1], scale_);
}

}  // namespace sd
