#include "engine/web_noise.h"

#include <string>

#include "sd/error.h"

namespace sd {

bool uses_web_noise(const NoiseSettings& s) {
    return s.rng != "cpu" || s.ensd != 0 || (s.subseed && s.subseed_strength != 0) || s.seed_resize_from_w > 0 ||
           s.seed_resize_from_h > 0;
}

at::Tensor web_slerp(double val, const at::Tensor& low, const at::Tensor& high) {
    // torch.norm(x, dim=1) is linalg.vector_norm(x, 2, [1]) underneath.
    const at::Tensor low_norm = low / at::linalg_vector_norm(low, 2, {1}, true);
    const at::Tensor high_norm = high / at::linalg_vector_norm(high, 2, {1}, true);
    const at::Tensor dot = (low_norm * high_norm).sum(1);
    // rng.py's fallback, weights as it has them (low gets val, not 1 - val).
    if ((dot.mean() > 0.9995).item<bool>()) return low * val + high * (1 - val);
    const at::Tensor omega = at::acos(dot);
    const at::Tensor so = at::sin(omega);
    return (at::sin((1.0 - val) * omega) / so).unsqueeze(1) * low + (at::sin(val * omega) / so).unsqueeze(1) * high;
}

RandomStream::RandomStream(bool nv, uint64_t seed) {
    if (nv)
        nv_.emplace(seed);
    else
        cpu_ = at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor RandomStream::randn(at::IntArrayRef shape) {
    if (cpu_) return at::randn(shape, *cpu_);
    at::Tensor t = at::empty(shape, at::kFloat);
    nv_->randn(t.data_ptr<float>(), static_cast<size_t>(t.numel()));
    return t;
}

SeedNoise::SeedNoise(const NoiseSettings& s, uint64_t seed) : s_(s), seed_(seed), nv_(s.rng == "nv"), main_(nv_, seed) {
    if (s.subseed && s.subseed_strength != 0) sub_.emplace(nv_, *s.subseed);
    if (s.seed_resize_from_w > 0 && s.seed_resize_from_h > 0) old_size_.emplace(nv_, seed);
}

// rng.py's ImageRNG.first() for the rows of shape[0] drawn as one.
at::Tensor SeedNoise::first(at::IntArrayRef shape, int64_t factor) {
    std::vector<int64_t> noise_shape = shape.vec();
    if (old_size_) {
        noise_shape[2] = s_.seed_resize_from_h / factor;
        noise_shape[3] = s_.seed_resize_from_w / factor;
    }
    const bool resized = noise_shape != shape.vec();
    at::Tensor subnoise;
    if (sub_) subnoise = sub_->randn(noise_shape);
    at::Tensor noise = resized ? old_size_->randn(noise_shape) : main_.randn(shape);
    if (sub_) {
        // The web UI blends each image's [C, h, w] on its own.
        std::vector<at::Tensor> rows;
        for (int64_t i = 0; i < noise.size(0); ++i)
            rows.push_back(web_slerp(s_.subseed_strength, noise[i], subnoise[i]));
        noise = at::stack(rows);
    }
    if (resized) {
        // The old size's noise pasted centred into noise of the new size (cut where it is larger).
        at::Tensor x = main_.randn(shape);
        auto half = [](int64_t d) { return d >= 0 ? d / 2 : -((1 - d) / 2); };  // Python's d // 2
        const int64_t dx = half(shape[3] - noise_shape[3]), dy = half(shape[2] - noise_shape[2]);
        const int64_t w = dx >= 0 ? noise_shape[3] : noise_shape[3] + 2 * dx;
        const int64_t h = dy >= 0 ? noise_shape[2] : noise_shape[2] + 2 * dy;
        const int64_t tx = dx < 0 ? 0 : dx, ty = dy < 0 ? 0 : dy;
        const int64_t sx = dx < 0 ? -dx : 0, sy = dy < 0 ? -dy : 0;
        x.narrow(2, ty, h).narrow(3, tx, w).copy_(noise.narrow(2, sy, h).narrow(3, sx, w));
        noise = x;
    }
    // ENSD: the later draws come from a generator seeded seed + ENSD (once a run).
    if (s_.ensd != 0 && !reseeded_) {
        main_ = RandomStream(nv_, seed_ + static_cast<uint64_t>(s_.ensd));
        reseeded_ = true;
    }
    return noise;
}

void RunNoise::seed(uint64_t seed) {
    seed_ = seed;
    lane_.reset();
}

at::Tensor RunNoise::start(const NoiseSettings& s, at::Generator& gen, at::IntArrayRef shape, int64_t factor,
                           const at::Tensor& drawn) {
    log_.clear();
    draws_.gen.reset();
    draws_.lane = nullptr;
    draws_.log = record_ ? &log_ : nullptr;
    at::Tensor noise;
    if (!uses_web_noise(s)) {
        noise = drawn.defined() ? drawn : at::randn(shape, gen);
        draws_.gen.emplace(gen);
    } else {
        if (!lane_ || !(lane_->settings() == s)) lane_.emplace(s, seed_);  // other settings: their own generator
        noise = lane_->first(shape, factor);
        draws_.lane = &*lane_;
    }
    if (record_) log_.push_back(noise.clone());
    return noise;
}

at::Tensor RunNoise::Draws::next(const at::Tensor& x) {
    at::Tensor t = gen ? gen->next(x) : lane->next(x.sizes()).to(x.options());
    if (log) log->push_back(t.clone());
    return t;
}

uint64_t RunNoise::Draws::next_tree_seed() {
    if (!gen)
        throw Error(
            "--brownian-tree kdiffusion draws its seed from the tool's own generator: not with --rng nv, "
            "--ensd, --subseed or --seed-resize-from (use --brownian-tree a1111)");
    return gen->next_tree_seed();
}

at::Tensor RunNoise::Draws::seeded_randn(uint64_t seed, at::IntArrayRef size) {
    if (lane && lane->settings().rng == "nv") return RandomStream(true, seed).randn(size);
    return StepNoise::seeded_randn(seed, size);
}

void RunNoise::Draws::noted(const at::Tensor& noise) {
    if (log) log->push_back(noise.clone());
}

at::Tensor RunNoise::recorded() const {
    if (!record_ || log_.empty()) return {};
    for (const auto& t : log_)
        if (!t.sizes().equals(log_[0].sizes()))
            throw Error("--save-noise: the sampler drew noise of shape " + std::string(c10::str(t.sizes())) +
                        " beside the start noise's " + std::string(c10::str(log_[0].sizes())) +
                        "; one .npy cannot hold both");
    return at::stack(log_).contiguous();
}

}  // namespace sd
