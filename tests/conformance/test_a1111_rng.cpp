// The web UI's noise (issue 35 part 2) against shared/conformance/a1111-rng/
// (the web UI's rng.py and rng_philox.py run on given seeds): every case
// through the CLI with --save-noise (NV within 1e-6, CPU exact, as its README
// says), the slerp of its variation seeds, --save-noise's layout in both seed
// modes, and what is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/philox.h"
#include "engine/web_noise.h"
#include "io/npy.h"
#include "test_util.h"

namespace {

std::string rng_dir() { return sdtest::env("SD_SHARED_CONFORMANCE") + "/a1111-rng"; }
std::string tiny() { return sdtest::test_models() + "/tiny-st"; }

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(sdtest::read_text(path)); }

at::Tensor load(const std::string& path) {
    const sd::NpyArray a = sd::read_npy(path);
    EXPECT_EQ(a.dtype, "<f4") << path;
    return at::from_blob(const_cast<char*>(a.data.data()), a.shape, at::kFloat).clone();
}

at::Tensor philox(uint64_t seed, at::IntArrayRef shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    sd::PhiloxGenerator(seed).randn(t.data_ptr<float>(), static_cast<size_t>(t.numel()));
    return t;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// A tiny-model run that saves its noise; euler draws one tensor a step.
at::Tensor run_noise(const std::vector<std::string>& extra, int width, int height, int steps,
                     const std::string& sampler = "euler") {
    const std::string dir = sdtest::temp_dir();
    std::vector<std::string> argv = {sdtest::cli(), "--model",   tiny(),        "--prompt", "a fox", "--quiet",
                                     "--outdir",    dir + "/img", "--sampler",  sampler,    "--steps",
                                     std::to_string(steps),       "--W",        std::to_string(width),
                                     "--H",         std::to_string(height),     "--save-noise", dir + "/noise.npy"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = sdtest::run(argv);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return {};
    return load(dir + "/noise.npy");
}

// One case as flags. The web UI's seeds are seed + i: --seed-mode per-image
// with --n_samples n gives that in one run; other seed lists (a variation
// batch, whose seeds the web UI keeps and whose variation seeds it numbers)
// are run one image at a time, which per-image generators make the same.
at::Tensor case_noise(const nlohmann::json& a) {
    const auto seeds = a["seeds"].get<std::vector<uint64_t>>();
    const int n_next = a["n_next"].get<int>();
    auto flags = [&](size_t i, size_t n) {
        std::vector<std::string> f = {"--rng",         a["source"] == "NV" ? "nv" : "cpu",
                                      "--seed",        std::to_string(seeds[i]),
                                      "--seed-mode",   "per-image",
                                      "--n_samples",   std::to_string(n),
                                      "--ensd",        std::to_string(a["eta_noise_seed_delta"].get<int64_t>())};
        if (!a["subseeds"].is_null() && a["subseed_strength"].get<double>() != 0) {
            const auto subs = a["subseeds"].get<std::vector<uint64_t>>();
            char strength[32];
            std::snprintf(strength, sizeof strength, "%.17g", a["subseed_strength"].get<double>());
            f.insert(f.end(), {"--subseed", std::to_string(i < subs.size() ? subs[i] : 0), "--subseed-strength",
                               strength});
        }
        if (a["seed_resize_from_w"].get<int>() > 0 && a["seed_resize_from_h"].get<int>() > 0)
            f.insert(f.end(), {"--seed-resize-from", std::to_string(a["seed_resize_from_w"].get<int>()) + "x" +
                                                         std::to_string(a["seed_resize_from_h"].get<int>())});
        return f;
    };
    bool numbered = true;
    for (size_t i = 0; i < seeds.size(); ++i) numbered = numbered && seeds[i] == seeds[0] + i;
    if (!a["subseeds"].is_null() && seeds.size() > 1) numbered = false;  // one variation seed per run
    const int w = a["W"].get<int>(), h = a["H"].get<int>();
    if (numbered) return run_noise(flags(0, seeds.size()), w, h, n_next);
    std::vector<at::Tensor> images;
    for (size_t i = 0; i < seeds.size(); ++i) images.push_back(run_noise(flags(i, 1), w, h, n_next));
    return at::cat(images, 1);
}

}  // namespace

TEST(A1111Rng, EveryCaseThroughTheCli) {
    const auto names = read_json(rng_dir() + "/index.json");
    ASSERT_GE(names.size(), 8u);
    for (const auto& name : names) {
        SCOPED_TRACE(name.get<std::string>());
        const std::string dir = rng_dir() + "/" + name.get<std::string>();
        const auto a = read_json(dir + "/args.json");
        const at::Tensor first = load(dir + "/noise_first.npy"), next = load(dir + "/noise_next.npy");
        const at::Tensor got = case_noise(a);
        ASSERT_TRUE(got.defined());
        ASSERT_EQ(got.dim(), 5);
        ASSERT_EQ(got.size(0), 1 + next.size(0));  // euler: one draw a step
        ASSERT_TRUE(got[0].sizes().equals(first.sizes())) << got.sizes() << " " << first.sizes();
        const double tolerance = a["source"] == "NV" ? 1e-6 : 0;
        EXPECT_LE(max_diff(got[0], first), tolerance) << "start noise";
        EXPECT_LE(max_diff(got.slice(0, 1), next), tolerance) << "the sampler's draws";
    }
}

// rng.py's slerp: the variation case from its two seeds' plain draws, and its
// fallback for noises that point the same way (weights as rng.py has them).
TEST(A1111Rng, Slerp) {
    const std::string dir = rng_dir() + "/nv_variation_64x128";
    const auto a = read_json(dir + "/args.json");
    const auto shape = a["latent_shape"].get<std::vector<int64_t>>();
    const at::Tensor low = philox(a["seeds"][0].get<uint64_t>(), shape);
    const at::Tensor high = philox(a["subseeds"][0].get<uint64_t>(), shape);
    const at::Tensor want = load(dir + "/noise_first.npy")[0];
    EXPECT_LE(max_diff(sd::web_slerp(a["subseed_strength"].get<double>(), low, high), want), 1e-6);
    EXPECT_GT(max_diff(low, want), 0.01);  // the blend moved it
    EXPECT_LE(max_diff(sd::web_slerp(0.0, low, high), low), 1e-5);
    EXPECT_LE(max_diff(sd::web_slerp(1.0, low, high), high), 1e-5);
    // Parallel noises take the linear branch: low * val + high * (1 - val).
    const at::Tensor twice = low * 2;
    EXPECT_TRUE(at::equal(sd::web_slerp(0.25, low, twice), low * 0.25 + twice * 0.75));
}

// Default settings: --save-noise holds the CPU generator's own draws, in order;
// dpmpp_2m draws nothing (D = 0); the images are those of a run without it.
TEST(A1111Rng, SaveNoiseOfTheDefaultSource) {
    const at::Tensor got = run_noise({"--seed", "11", "--n_samples", "2"}, 64, 64, 3);
    ASSERT_TRUE(got.defined());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    ASSERT_EQ(got.size(0), 4);
    for (int64_t k = 0; k < 4; ++k) EXPECT_TRUE(at::equal(got[k], at::randn({2, 4, 8, 8}, gen))) << k;
    const at::Tensor none = run_noise({"--seed", "11", "--n_samples", "2"}, 64, 64, 3, "dpmpp_2m");
    ASSERT_TRUE(none.defined());
    EXPECT_EQ(none.sizes().vec(), (std::vector<int64_t>{1, 2, 4, 8, 8}));

    const std::string dir = sdtest::temp_dir();
    for (const char* sub : {"a", "b"}) {
        std::vector<std::string> argv = {sdtest::cli(), "--model", tiny(), "--prompt", "a fox", "--quiet", "--outdir",
                                         dir + "/" + sub, "--sampler", "euler_a", "--steps", "3", "--W", "64", "--H",
                                         "64"};
        if (sub[0] == 'b') argv.insert(argv.end(), {"--save-noise", dir + "/n.npy"});
        ASSERT_EQ(sdtest::run(argv).exit_code, 0);
    }
    EXPECT_EQ(sdtest::read_text(dir + "/a/00000.png"), sdtest::read_text(dir + "/b/00000.png"));
}

// compvis mode with --rng nv: one generator for the run, each draw the whole
// batch's; the second batch goes on from the first's. --save-noise puts the
// batches side by side.
TEST(A1111Rng, CompvisNvIsOneGeneratorForTheRun) {
    const at::Tensor got = run_noise({"--rng", "nv", "--seed", "5", "--n_samples", "2", "--n_iter", "2"}, 64, 64, 1);
    ASSERT_TRUE(got.defined());
    ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{2, 4, 4, 8, 8}));
    sd::PhiloxGenerator g(5);
    for (int64_t batch = 0; batch < 2; ++batch)
        for (int64_t k = 0; k < 2; ++k) {
            at::Tensor want = at::empty({2, 4, 8, 8}, at::kFloat);
            g.randn(want.data_ptr<float>(), static_cast<size_t>(want.numel()));
            EXPECT_TRUE(at::equal(got[k].slice(0, 2 * batch, 2 * batch + 2), want)) << batch << " " << k;
        }
}

// Bad values: one line, exit 1, before any model loads; an existing --save-noise file is never replaced.
TEST(A1111Rng, Refusals) {
    const std::string dir = sdtest::temp_dir();
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--subseed", "3", "--subseed-strength", "1.5"}, "--subseed-strength must be from 0 to 1"},
        {{"--subseed-strength", "0.5"}, "needs --subseed"},
        {{"--seed-resize-from", "512"}, "--seed-resize-from"},
        {{"--seed-resize-from", "512x0"}, "--seed-resize-from"},
        {{"--rng", "gpu"}, "--rng must be cpu or nv"},
        {{"--subseed", "-4"}, "--subseed"},
        {{"--ensd", "many"}, "--ensd"},
    };
    for (const auto& [flags, message] : cases) {
        std::vector<std::string> argv = {sdtest::cli(), "--model", tiny(), "--prompt", "x", "--outdir", dir};
        argv.insert(argv.end(), flags.begin(), flags.end());
        const auto r = sdtest::run(argv);
        EXPECT_EQ(r.exit_code, 1) << flags[0];
        EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
        EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    }
    sdtest::write_text(dir + "/taken.npy", "mine");
    const auto r = sdtest::run({sdtest::cli(), "--model", tiny(), "--prompt", "x", "--outdir", dir + "/img", "--steps",
                                "2", "--W", "64", "--H", "64", "--save-noise", dir + "/taken.npy"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("--save-noise"), std::string::npos) << r.err;
    EXPECT_EQ(sdtest::read_text(dir + "/taken.npy"), "mine");
}
