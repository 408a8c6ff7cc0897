// Classifier-free guidance: the UNet rows of one sampler step. With guidance
// each image runs twice, unconditional rows first, then conditional ones
// (CompVis' cat([uc, c])), and the two outputs combine as e_u + s (e_c - e_u).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

namespace sd {

// The UNet over some rows: latents, timesteps, the matching text context rows
// and, for SDXL, the vector rows (undefined otherwise). Returns fp32 on the CPU.
using UnetFn =
    std::function<at::Tensor(const at::Tensor& x, const at::Tensor& t, const at::Tensor& context, const at::Tensor& y)>;

// What the UNet is conditioned on, one row per image for each side; the
// unconditional side is undefined at scale 1 (no guidance); y only for SDXL.
struct UnetConditioning {
    at::Tensor cond, uncond;
    at::Tensor cond_y, uncond_y;
    // An inpainting UNet's extra input channels, one row per image (the
    // latent-size mask and the masked picture's latents), the same for both
    // sides: they follow the latents on the channel axis (diffusers' and
    // RunwayML's order). Undefined for other models.
    at::Tensor concat;
};

// The text of one sampling pass as it changes from one model call to the next
// (A1111's prompt editing and alternation, engine/text_schedule.h): spans[k]
// serves the calls after spans[k - 1].last_call up to its own last_call
// (calls counted from 0); a call past the last span keeps the last text.
// Each text is as above (its concat unused: Guidance takes it apart), except
// where A1111's composable prompts ("a cat AND a dog:0.5") give an image more
// conditional rows: then `parts` says, for each conditional row in order, its
// image and weight, and the image's output is e_u + scale * sum(w (e_c - e_u)).
// Empty parts: one conditional row per image, weight 1.
struct TextSchedule {
    struct Span {
        long long last_call;
        size_t text;  // into texts
    };
    struct Part {
        int64_t image;
        double weight;
    };
    std::vector<UnetConditioning> texts;
    std::vector<Span> spans;
    std::vector<Part> parts;
};

// e_u + scale * (e_c - e_u): the guided output of the two halves.
at::Tensor guide(const at::Tensor& uncond_out, const at::Tensor& cond_out, double scale);

// The sampler's model function over a guided (or unguided) UNet, run in passes
// of at most rows_per_pass rows so the activations fit the memory plan.
class Guidance {
public:
    Guidance(UnetFn unet, const UnetConditioning& text, double scale, int64_t rows_per_pass);
    // A text that changes during the pass; concat as UnetConditioning's.
    Guidance(UnetFn unet, const TextSchedule& text, const at::Tensor& concat, double scale, int64_t rows_per_pass);
    bool guided() const { return guided_; }
    // The guided output for x at timesteps t (one per image).
    at::Tensor operator()(const at::Tensor& x, const at::Tensor& t);
    long long evaluations() const { return evaluations_; }
    long long rows() const { return rows_; }  // UNet rows run: two per image when guided, more with parts

private:
    // One text's UNet inputs, both sides in row order.
    struct Context {
        at::Tensor context, y;
    };
    at::Tensor run(const at::Tensor& x, const at::Tensor& t, const Context& c) const;
    // Call evaluations_'s text; both sides joined for the call (not held for every text:
    // an edited prompt may have many).
    Context current() const;
    UnetFn unet_;
    std::vector<UnetConditioning> texts_;
    std::vector<TextSchedule::Span> spans_;
    std::vector<TextSchedule::Part> parts_;
    at::Tensor part_images_;  // parts_' images, to repeat an image's rows for its parts
    at::Tensor concat_;
    double scale_;
    int64_t rows_per_pass_;
    bool guided_;
    long long evaluations_ = 0, rows_ = 0;
};

}  // namespace sd
