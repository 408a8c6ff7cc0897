// The other k-diffusion samplers and schedules, with the web UI's names,
// against shared/conformance/tiny/cases_k2 (every case found there): the
// sigmas, every denoiser call and step with the reference UNet replayed, the
// random draws and the Brownian-tree noise (engine/brownian_tree.h), and the
// whole case through the CLI with the names the web UI writes into its PNGs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "conformance_util.h"
#include "core/schedule.h"
#include "engine/brownian_tree.h"
#include "engine/sampling_loop.h"
#include "engine/samplers/k_diffusion.h"
#include "sd/sampler_catalog.h"
#include "test_util.h"

namespace {

std::string cases_dir() { return std::string(SD_SHARED_CONFORMANCE_DIR) + "/tiny/cases_k2"; }

std::vector<std::string> all_cases() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(cases_dir()))
        if (std::filesystem::exists(e.path() / "args.json")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

std::string case_dir(const std::string& c) { return cases_dir() + "/" + c; }
at::Tensor load(const std::string& c, const std::string& file) { return sdtest::load_tensor(case_dir(c) + "/" + file); }
bool has(const std::string& c, const std::string& file) { return std::filesystem::exists(case_dir(c) + "/" + file); }
nlohmann::json args(const std::string& c) { return sdtest::read_json(case_dir(c) + "/args.json"); }
std::string tiny_model() { return sdtest::test_models() + "/tiny-st"; }
double max_of(const at::Tensor& t) { return t.abs().max().item<double>(); }

// The web UI's names of a case, from what it writes into the PNG (v1.9+):
// "Sampler: DPM++ 2M SDE Heun, Schedule type: Karras (with the setting ...)".
struct WebUiNames {
    std::string sampler, schedule;
};
WebUiNames web_ui_names(const nlohmann::json& a) {
    const std::string text = a.at("a1111").at("v1.9+").get<std::string>();
    std::smatch m;
    EXPECT_TRUE(std::regex_search(text, m, std::regex("Sampler: ([^,]+), Schedule type: ([^,(]+)"))) << text;
    std::string schedule = m[2];
    while (!schedule.empty() && schedule.back() == ' ') schedule.pop_back();
    return {m[1], schedule};
}

// What the web UI was asked for (the DDIM schedule may run one step more).
int requested_steps(const nlohmann::json& a) {
    const auto it = a.find("steps_requested");
    return it == a.end() || it->is_null() ? a.at("steps").get<int>() : it->get<int>();
}

bool kdiffusion_tree(const nlohmann::json& a) {
    return !a.at("noise_sampler").is_null() && a["noise_sampler"].get<std::string>().rfind("k-diffusion", 0) == 0;
}

// The library settings of a case, from the web UI's names as the CLI settles them.
sd::SamplerSettings settings(const nlohmann::json& a) {
    const WebUiNames names = web_ui_names(a);
    const sd::SamplerName named = sd::settle_sampler_names(names.sampler, names.schedule, "default");
    sd::SamplerSettings s;
    s.sampler = named.sampler;
    s.schedule = sd::effective_schedule(named.sampler, named.schedule);
    s.steps = requested_steps(a);
    s.brownian_tree = kdiffusion_tree(a) ? "kdiffusion" : "a1111";
    const uint64_t seed = a.at("seed").get<uint64_t>();
    for (int i = 0; i < a.at("n_samples").get<int>(); ++i) s.seeds.push_back(seed + static_cast<uint64_t>(i));
    return s;
}

// The CPU generator's draws, each kept, and the Brownian-tree noise the sampler notes.
struct RecordedNoise : sd::GeneratorNoise {
    explicit RecordedNoise(at::Generator& gen) : sd::GeneratorNoise(gen) {}
    at::Tensor next(const at::Tensor& x) override {
        drawn.push_back(sd::GeneratorNoise::next(x));
        return drawn.back();
    }
    uint64_t next_tree_seed() override {
        tree_seeds.push_back(sd::GeneratorNoise::next_tree_seed());
        return tree_seeds.back();
    }
    void noted(const at::Tensor& noise) override { tree_noise.push_back(noise); }
    std::vector<at::Tensor> drawn, tree_noise;
    std::vector<uint64_t> tree_seeds;
};

}  // namespace

TEST(KSamplers2, EveryPublicCaseIsHere) {
    EXPECT_GE(all_cases().size(), 28u);
    for (const auto& c : all_cases()) EXPECT_NO_THROW(sd::sampler_info(settings(args(c)).sampler)) << c;
}

TEST(KSamplers2, SigmasMatchWithin1e6Relative) {
    const auto ac = sdtest::model_alphas_cumprod(tiny_model());
    for (const auto& c : all_cases()) {
        const auto a = args(c);
        const auto s = settings(a);
        const at::Tensor got = sd::sampler_sigmas(s, ac);
        const at::Tensor ref = at::tensor(a.at("sigmas").get<std::vector<float>>());
        ASSERT_EQ(got.sizes(), ref.sizes()) << c;
        auto diff = (got.to(at::kDouble) - ref.to(at::kDouble)).abs();
        auto rel = diff / ref.to(at::kDouble).abs().clamp_min(1e-30);
        EXPECT_LE(rel.max().item<double>(), 1e-6) << c << "\n" << got << "\n" << ref;
        EXPECT_EQ(sd::sampler_step_count(s.sampler, s.schedule, s.steps, 1000), a.at("steps").get<int>()) << c;
    }
}

// numpy's SeedSequence and the tree's top increment, as bt_trace.json and bt_top_W.npy record them.
TEST(KSamplers2, BrownianTreeSeedsAndTopIncrement) {
    int trees_seen = 0;
    for (const auto& c : all_cases()) {
        if (!has(c, "bt_trace.json")) continue;
        const auto trace = sdtest::read_json(case_dir(c) + "/bt_trace.json");
        const auto top_w = load(c, "bt_top_W.npy");
        int t = 0;
        for (const auto& sampler : trace.at("noise_samplers")) {
            for (const auto& tree : sampler.at("trees")) {
                const uint64_t entropy = tree.at("entropy").get<uint64_t>();
                std::vector<uint32_t> words;
                for (const auto& [key, value] : tree.items())
                    if (key.rfind("top_seeds", 0) == 0) words = value.get<std::vector<uint32_t>>();
                ASSERT_EQ(words.size(), 3u) << c;
                EXPECT_EQ(sd::seed_sequence_state(entropy, {}, 24, 3), words) << c;
                const auto sigmas = load(c, "sigmas.npy");
                const double lo = sigmas.masked_select(sigmas > 0).min().item<float>();
                const double hi = sigmas.max().item<float>();
                EXPECT_EQ(sd::round6(lo), tree.at("t0").get<double>()) << c;
                EXPECT_EQ(sd::round6(hi), tree.at("t1").get<double>()) << c;
                sd::BrownianTree bt(lo, hi, entropy, tree.at("size").get<std::vector<int64_t>>(),
                                    [](uint64_t seed, at::IntArrayRef size) {
                                        at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
                                        return at::randn(size, g, at::TensorOptions(at::kFloat));
                                    });
                EXPECT_TRUE(at::equal(bt.top(), top_w[t])) << c << " tree " << t;
                ++t;
                ++trees_seen;
            }
        }
        // Every node split: its seed from (entropy, spawn key, depth).
        const auto& cols = trace.at("nodes_columns");
        auto col = [&](const char* name) {
            return static_cast<size_t>(std::find(cols.begin(), cols.end(), name) - cols.begin());
        };
        for (const auto& node : trace.at("nodes")) {
            const auto& tree = trace["noise_samplers"][0]["trees"][node[col("tree")].get<size_t>()];
            const auto words = sd::seed_sequence_state(
                tree.at("entropy").get<uint64_t>(), {node[col("spawn_key")].get<uint64_t>(), node[col("depth")].get<uint64_t>()},
                24, 4);
            EXPECT_EQ(words[0], node[col("W_seed")].get<uint32_t>()) << c;
            EXPECT_EQ(sd::round6(0.5 * (node[col("start")].get<double>() + node[col("end")].get<double>())),
                      node[col("midway")].get<double>())
                << c;
        }
    }
    EXPECT_GE(trees_seen, 8);
}

namespace {

// Replays the reference UNet through sd::sample and checks every step, every
// draw, the Brownian-tree noise and the latents by the fixture criteria.
void replay(const std::string& c) {
    SCOPED_TRACE(c);
    c10::InferenceMode guard;
    const auto a = args(c);
    const auto ac = sdtest::model_alphas_cumprod(tiny_model());
    auto xs = load(c, "unet_x.npy"), ts = load(c, "unet_t.npy"), outs = load(c, "unet_out.npy");
    auto den_out = load(c, "den_out.npy"), steps_x = load(c, "steps_x.npy"), latents = load(c, "latents.npy");
    const at::Tensor first_call = has(c, "step_first_call.npy") ? load(c, "step_first_call.npy") : at::Tensor();
    auto start = load(c, "start_noise.npy");
    const int64_t n = start.size(0);
    sdtest::ReplayedUnet unet{xs, ts, outs, n, a.at("scale").get<double>(), c};
    sd::ModelFn model = [&](const at::Tensor& x, const at::Tensor& t) { return unet(x, t); };
    const int steps = a.at("steps").get<int>();
    int seen = 0;
    sd::StepFn on_step = [&](int i, int total, const at::Tensor& x, const at::Tensor& denoised) {
        EXPECT_EQ(total, steps);
        const int64_t k = first_call.defined() ? first_call[i].item<int64_t>() : i;
        EXPECT_LE(sdtest::max_abs_diff(denoised, den_out[k]), 1e-4 * max_of(den_out[k])) << "step " << i;
        EXPECT_LE(sdtest::max_abs_diff(x, steps_x[i]), 1e-4 * max_of(steps_x[i])) << "step " << i;
        ++seen;
    };
    const sd::SamplerSettings s = settings(a);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(a.at("seed").get<uint64_t>());
    EXPECT_TRUE(at::equal(at::randn(start.sizes(), gen), start)) << "start noise";
    RecordedNoise draws(gen);
    const at::Tensor out = sd::sample(s, model, start, ac, draws, on_step);
    EXPECT_EQ(seen, steps);
    EXPECT_EQ(unet.calls, a.at("denoiser_calls").get<int64_t>()) << "UNet calls";
    EXPECT_LE(sdtest::max_abs_diff(out, latents), 1e-4 * max_of(latents));

    // The generator's draws: the ancestral samplers' noise bit for bit, and exactly the reference's count.
    EXPECT_EQ(static_cast<int>(draws.drawn.size()), a.at("rng_draw_count").get<int>());
    if (has(c, "step_noise.npy")) {
        const auto ref = load(c, "step_noise.npy");
        ASSERT_EQ(static_cast<int64_t>(draws.drawn.size()), ref.size(0));
        for (int64_t m = 0; m < ref.size(0); ++m) EXPECT_TRUE(at::equal(draws.drawn[m], ref[m])) << "draw " << m;
    }
    // The Brownian trees: their seeds and every noise_sampler(sigma, sigma_next) result within 1e-6 relative.
    if (has(c, "bt_noise.npy")) {
        const auto ref = load(c, "bt_noise.npy");
        ASSERT_EQ(static_cast<int64_t>(draws.tree_noise.size()), ref.size(0));
        for (int64_t m = 0; m < ref.size(0); ++m)
            EXPECT_LE(sdtest::max_abs_diff(draws.tree_noise[m], ref[m]), 1e-6 * max_of(ref[m])) << "tree noise " << m;
        const auto seeds = a.at("brownian_tree_seeds").get<std::vector<uint64_t>>();
        EXPECT_EQ(s.brownian_tree == "kdiffusion" ? draws.tree_seeds : s.seeds, seeds);
    } else {
        EXPECT_TRUE(draws.tree_noise.empty());
    }
    // What the run drew leaves the generator where the reference's does (the next batch's start noise).
    at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(a.at("seed").get<uint64_t>());
    at::randn(start.sizes(), fresh);
    for (int i = 0; i < a.at("rng_draw_count").get<int>(); ++i) at::randn(start.sizes(), fresh);
    if (s.brownian_tree == "kdiffusion" && has(c, "bt_noise.npy")) at::randint(0, INT64_MAX, {}, fresh);
    EXPECT_TRUE(at::equal(at::randn(start.sizes(), gen), at::randn(start.sizes(), fresh))) << "generator draws";
}

}  // namespace

TEST(KSamplers2, ReplayReferenceUnet) {
    for (const auto& c : all_cases()) replay(c);
}

// The SDE samplers' other tree seeding gives another picture: the seeding is not ignored.
TEST(KSamplers2, TheTreeSeedingMatters) {
    c10::InferenceMode guard;
    const std::string c = "pq10_dpmppsde_karras7_a1111_64x64";
    const auto a = args(c);
    const auto ac = sdtest::model_alphas_cumprod(tiny_model());
    auto start = load(c, "start_noise.npy");
    sd::ModelFn model = [](const at::Tensor& x, const at::Tensor&) { return x * 0.1; };
    auto run = [&](const std::string& tree, uint64_t seed) {
        sd::SamplerSettings s = settings(a);
        s.brownian_tree = tree;
        s.seeds = {seed};
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
        return sd::sample(s, model, start, ac, gen);
    };
    const at::Tensor base = run("a1111", 1001);
    EXPECT_TRUE(at::equal(base, run("a1111", 1001)));
    EXPECT_FALSE(at::equal(base, run("a1111", 1002)));
    EXPECT_FALSE(at::equal(base, run("kdiffusion", 1001)));
}

// ---- through the CLI, with the web UI's names and compvis (one generator) batch noise ----

namespace {

std::vector<std::string> cli_args(const std::string& c, const std::string& sampler, const std::string& schedule,
                                  const std::string& out) {
    const auto a = args(c);
    const int steps = requested_steps(a);
    std::vector<std::string> v = {sdtest::cli(), "--model", tiny_model(), "--outdir", out + "/img", "--quiet",
                                  "--seed", std::to_string(a.at("seed").get<uint64_t>()), "--seed-mode", "compvis",
                                  "--H", std::to_string(a.at("H").get<int>()), "--W", std::to_string(a.at("W").get<int>()),
                                  "--steps", std::to_string(steps), "--sampler", sampler,
                                  "--scale", std::to_string(a.at("scale").get<double>()),
                                  "--n_samples", std::to_string(a.at("n_samples").get<int>()),
                                  "--prompt", a.at("prompts")[0].get<std::string>(), "--threads", "1",
                                  "--brownian-tree", kdiffusion_tree(a) ? "kdiffusion" : "a1111"};
    if (!schedule.empty()) v.insert(v.end(), {"--schedule", schedule});
    const std::string negative = a.value("unconditional_prompt", "");
    if (!negative.empty()) v.insert(v.end(), {"--negative-prompt", negative});
    for (const auto& p : a.at("prompts")) EXPECT_EQ(p, a["prompts"][0]) << c << ": one prompt for the batch";
    return v;
}

}  // namespace

struct K2Cli : ::testing::TestWithParam<std::string> {};

TEST_P(K2Cli, WebUiNamesMatchTheReference) {
    const std::string c = GetParam();
    const WebUiNames names = web_ui_names(args(c));
    const std::string out = sdtest::temp_dir();
    sdtest::check_cli_run(case_dir(c), cli_args(c, names.sampler, names.schedule, out), out);
}

INSTANTIATE_TEST_SUITE_P(TinyK2Cases, K2Cli, ::testing::ValuesIn(all_cases()));

// The web UI 1.6-1.8 named the schedule in the sampler ("DPM2 Karras"); its bare names meant the model's sigmas.
TEST(K2CliOldNames, CombinedNamesMatchTheReference) {
    for (const char* c : {"pq03_dpm2_karras_discard9_64x64", "pq13_dpmpp2msde_exp10_a1111_64x64",
                          "pq09_dpmpp2sa_model8_batch2_96x64"}) {
        SCOPED_TRACE(c);
        const auto a = args(c);
        const std::string old = a.at("a1111").at("v1.6-1.8").get<std::string>();
        const std::string out = sdtest::temp_dir();
        const bool bare = old.find("Karras") == std::string::npos && old.find("Exponential") == std::string::npos;
        sdtest::check_cli_run(case_dir(c), cli_args(c, old, bare ? "Uniform" : "", out), out);
    }
}

TEST(K2CliOldNames, ACombinedNameAndAnotherScheduleAreRefused) {
    auto r = sdtest::run({sdtest::cli(), "--model", tiny_model(), "--outdir", sdtest::temp_dir(), "--quiet", "--prompt",
                          "a", "--H", "64", "--W", "64", "--steps", "2", "--sampler", "DPM++ 2M Karras", "--schedule",
                          "Exponential"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("Karras"), std::string::npos) << r.err;
}

TEST(K2CliNames, UnknownNamesAreRefusedWithTheChoices) {
    const std::vector<std::tuple<std::vector<std::string>, std::string, std::string>> cases = {
        {{"--sampler", "DPM++ 4M"}, "DPM++ 4M", "DPM++ 2M SDE Heun"},
        {{"--sampler", "euler", "--schedule", "Karass"}, "Karass", "Align Your Steps"}};
    for (const auto& [flags, value, listed] : cases) {
        std::vector<std::string> argv = {sdtest::cli(), "--model", tiny_model(), "--outdir", sdtest::temp_dir(),
                                         "--quiet", "--prompt", "a", "--H", "64", "--W", "64", "--steps", "2"};
        argv.insert(argv.end(), flags.begin(), flags.end());
        auto r = sdtest::run(argv);
        EXPECT_EQ(r.exit_code, 1) << value;
        EXPECT_EQ(sdtest::lines(r.err).size(), 1u) << r.err;
        EXPECT_NE(r.err.find(value), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(listed), std::string::npos) << r.err;
    }
}
