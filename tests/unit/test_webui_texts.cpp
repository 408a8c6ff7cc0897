// Parameters texts of other programs (issue 35 part 3): the web UI's, as quoted in
// tests/data/webui-parameters/ from public pages, and the fields this tool writes
// and reads back. Samplers the catalog may not have yet are looked up in it.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "run/batch_plan.h"
#include "sd/error.h"
#include "sd/from_png.h"
#include "sd/sampler_catalog.h"
#include "sd/version.h"
#include "test_util.h"

using nlohmann::json;

namespace {

// The catalog's row of a web UI sampler name that takes this schedule; nullptr when it has none.
const sd::SamplerInfo* catalog_row(const std::string& a1111, const std::string& schedule) {
    for (const auto& s : sd::samplers()) {
        if (s.a1111_name != a1111) continue;
        try {
            sd::check_sampler_settings(s.name, schedule);
            return &s;
        } catch (const sd::Error&) {
            return nullptr;
        }
    }
    return nullptr;
}

// The "Sampler" value of a text's settings line.
std::string sampler_field(const std::string& text) {
    const size_t at = text.find("Sampler: ") + 9;
    return text.substr(at, text.find(',', at) - at);
}

std::vector<std::string> sorted(std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
}

}  // namespace

// Every quoted text is read with the settings it records, or refused naming exactly the fields the tool cannot honour.
TEST(WebUiTexts, EachQuotedTextIsReadOrRefusedByName) {
    const json cases = json::parse(sdtest::read_text(std::string(SD_TEST_DATA_DIR) + "/webui-parameters/cases.json"));
    ASSERT_GE(cases.size(), 10u);
    for (const auto& c : cases) {
        SCOPED_TRACE(c["name"].get<std::string>());
        const std::string text = c["text"];
        const sd::RecordedImage r = sd::parse_parameters_text(text, "x.png");
        EXPECT_EQ(r.writer, sd::TextWriter::web_ui);
        EXPECT_EQ(r.rng, "nv");  // none records RNG: the web UI's GPU default
        const json read = c.value("read", json::object());
        const std::string sampler = read.value("sampler", c.value("sampler", ""));
        const std::string schedule = read.value("schedule", c.value("schedule", "default"));
        std::vector<std::string> refused = c.value("refused", std::vector<std::string>{});
        const sd::SamplerInfo* row = sampler.empty() ? nullptr : catalog_row(sampler, schedule);
        if (!sampler.empty() && !row) {
            refused.push_back("Sampler: " + sampler_field(text));
        } else if (row) {
            EXPECT_EQ(r.sampler, row->name);
            EXPECT_EQ(r.schedule.value_or("default"), schedule);
        }
        EXPECT_EQ(sorted(r.unhonoured), sorted(refused));
        if (refused.empty()) {
            EXPECT_EQ(sd::check_honoured(r, "x.png", false), "");
        } else {
            const std::string m = sdtest::error_of([&] { sd::check_honoured(r, "x.png", false); });
            EXPECT_EQ(m.rfind("x.png: this tool cannot honour ", 0), 0u) << m;
            for (const auto& f : refused) EXPECT_NE(m.find(f), std::string::npos) << m;
            EXPECT_NE(m.find("--from-png-lenient"), std::string::npos) << m;
        }
        if (read.empty()) continue;
        EXPECT_EQ(r.steps, read["steps"].get<int>());
        EXPECT_EQ(r.scale, read["scale"].get<double>());
        EXPECT_EQ(r.width, read["width"].get<int>());
        EXPECT_EQ(r.height, read["height"].get<int>());
        if (read.contains("seed"))
            EXPECT_EQ(r.seed, read["seed"].get<uint64_t>());
        else
            EXPECT_FALSE(r.seed.has_value());
        EXPECT_EQ(r.eta, read.contains("eta") ? std::optional<double>(read["eta"].get<double>()) : std::nullopt);
        EXPECT_EQ(r.ensd, read.value("ensd", int64_t{0}));
        EXPECT_EQ(r.strength, read.contains("strength") ? std::optional<double>(read["strength"].get<double>())
                                                         : std::nullopt);
        EXPECT_EQ(r.prompt.empty(), text.rfind("Steps: ", 0) == 0);
    }
}

TEST(WebUiTexts, TheDocstringsPromptsAreRead) {
    const json cases = json::parse(sdtest::read_text(std::string(SD_TEST_DATA_DIR) + "/webui-parameters/cases.json"));
    const auto r = sd::parse_parameters_text(cases.at(0)["text"], "x.png");
    EXPECT_EQ(r.prompt.rfind("girl with an artist's beret", 0), 0u);
    EXPECT_EQ(r.negative_prompt.rfind("ugly, fat, obese", 0), 0u);
    EXPECT_EQ(r.negative_prompt.back(), 'g');  // "... messy drawing"
}

// What this tool writes of the noise settings: the web UI's names, only where they differ from its defaults.
TEST(WebUiTexts, NoiseFieldsAreWrittenAsTheWebUiDoes) {
    sd::PromptItem item;
    item.prompt = "a fox";
    item.settings.sampler = "euler_a";
    item.settings.schedule = "karras";
    item.settings.steps = 20;
    item.settings.scale = 7;
    sd::PlannedImage img;
    img.seed = 1002;
    img.index = 2;
    auto& n = item.settings.noise;
    n.rng = "nv";
    const std::string tail = ", Seed mode: per-image, Image index: 2, Version: " + std::string(sd::kVersionName);
    const std::string head = "a fox\nSteps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 1002, "
                             "Size: 512x512, Model: m";
    // nv: "RNG: NV" (the web UI leaves it out, but this tool's older texts have no RNG and mean cpu)
    EXPECT_EQ(sd::parameters_text(item, img, sd::SeedMode::per_image, "m"), head + ", RNG: NV" + tail);
    n.ensd = 31337;
    n.subseed = 77;
    n.subseed_strength = 0.25;
    n.seed_resize_from_w = 256;
    n.seed_resize_from_h = 320;
    n.eta = 0.5;
    n.brownian_tree = "kdiffusion";
    EXPECT_EQ(sd::parameters_text(item, img, sd::SeedMode::per_image, "m"),
              head + ", Variation seed: 77, Variation seed strength: 0.25, Seed resize from: 256x320, ENSD: 31337, "
                     "RNG: NV, Eta: 0.5, Brownian tree: kdiffusion" + tail);
    // the defaults are not written: eta 1 for k-diffusion samplers, strength 0, cpu as the web UI's "CPU"
    n = sd::NoiseSettings{};
    n.eta = 1;
    n.subseed = 5;
    EXPECT_EQ(sd::parameters_text(item, img, sd::SeedMode::per_image, "m"), head + ", RNG: CPU" + tail);
    // DDIM's eta is the web UI's "Eta DDIM", default 0
    item.settings.sampler = "ddim";
    item.settings.schedule = "default";
    n.eta = 0.3;
    const std::string ddim = sd::parameters_text(item, img, sd::SeedMode::per_image, "m");
    EXPECT_NE(ddim.find(", RNG: CPU, Eta DDIM: 0.3, Seed mode"), std::string::npos) << ddim;
    n.eta = 0;
    EXPECT_EQ(sd::parameters_text(item, img, sd::SeedMode::per_image, "m").find("Eta"), std::string::npos);
}

// Written and read back: the same noise settings.
TEST(WebUiTexts, NoiseFieldsReadBack) {
    sd::PromptItem item;
    item.prompt = "a fox";
    item.settings.sampler = "euler_a";
    auto& n = item.settings.noise;
    n.rng = "nv";
    n.ensd = -5;
    n.subseed = 18446744073709551615ull;
    n.subseed_strength = 0.125;
    n.seed_resize_from_w = 64;
    n.seed_resize_from_h = 96;
    n.eta = 0.75;
    n.brownian_tree = "kdiffusion";
    sd::PlannedImage img;
    img.index = 3;
    const auto r = sd::parse_parameters_text(sd::parameters_text(item, img, sd::SeedMode::per_image, "m"), "x.png");
    EXPECT_EQ(r.writer, sd::TextWriter::this_tool);
    EXPECT_TRUE(r.unhonoured.empty());
    EXPECT_EQ(r.rng, "nv");
    EXPECT_EQ(r.ensd, -5);
    EXPECT_EQ(r.subseed, n.subseed);
    EXPECT_EQ(r.subseed_strength, 0.125);
    EXPECT_EQ(r.seed_resize_from_w, 64);
    EXPECT_EQ(r.seed_resize_from_h, 96);
    EXPECT_EQ(r.eta, 0.75);
    EXPECT_EQ(r.brownian_tree, "kdiffusion");
    // cpu is written, and a text of this tool without "RNG" (before nv existed) is cpu too
    n = sd::NoiseSettings{};
    EXPECT_EQ(sd::parse_parameters_text(sd::parameters_text(item, img, sd::SeedMode::compvis, "m"), "x.png").rng, "cpu");
    EXPECT_EQ(sd::parse_parameters_text("a\nSteps: 2, Sampler: PLMS, Seed: 1, Seed mode: compvis", "x.png").rng, "cpu");
}

// The web UI's fields in every form it has written them.
TEST(WebUiTexts, WebUiFieldsAreRead) {
    auto read = [](const std::string& fields) {
        return sd::parse_parameters_text("a fox\nSteps: 20, " + fields + ", Seed: 5, Size: 512x512, Version: v1.10.1",
                                         "w.png");
    };
    // v1.9+: the sampler and its schedule apart; older: in one name; v1.6-1.8: a lower-case "Schedule type".
    for (const std::string f : {"Sampler: DPM++ 2M, Schedule type: Karras", "Sampler: DPM++ 2M Karras",
                                "Sampler: DPM++ 2M Karras, Schedule type: Automatic", "Sampler: DPM++ 2M, Schedule type: karras"}) {
        const auto r = read(f);
        EXPECT_EQ(r.sampler, "dpmpp_2m") << f;
        EXPECT_EQ(r.schedule, "karras") << f;
        EXPECT_TRUE(r.unhonoured.empty()) << f;
    }
    EXPECT_EQ(read("Sampler: DPM++ 2M, Schedule type: Uniform").schedule, "default");
    // "Automatic": the catalog's name for the sampler's own choice (the model's sigmas for Euler a)
    EXPECT_EQ(read("Sampler: Euler a, Schedule type: Automatic").schedule, sd::schedule_from_a1111_name("Automatic"));
    // RNG: CPU, the GPU's numbers (GPU, NV), absent: the GPU
    EXPECT_EQ(read("Sampler: Euler a, RNG: CPU").rng, "cpu");
    EXPECT_EQ(read("Sampler: Euler a, RNG: NV").rng, "nv");
    EXPECT_EQ(read("Sampler: Euler a, RNG: GPU").rng, "nv");
    EXPECT_EQ(read("Sampler: Euler a").rng, "nv");
    // the variation seed, seed resize, ENSD and eta
    const auto v = read("Sampler: Euler a, Variation seed: 77, Variation seed strength: 0.3, Seed resize from: 256x384, "
                        "ENSD: 31337, Eta: 0.67");
    EXPECT_EQ(v.subseed, 77u);
    EXPECT_EQ(v.subseed_strength, 0.3);
    EXPECT_EQ(v.seed_resize_from_w, 256);
    EXPECT_EQ(v.seed_resize_from_h, 384);
    EXPECT_EQ(v.ensd, 31337);
    EXPECT_EQ(v.eta, 0.67);
    EXPECT_TRUE(v.unhonoured.empty());
    // "Eta DDIM" is DDIM's: for DDIM the eta, for a k-diffusion sampler nothing
    EXPECT_EQ(read("Sampler: DDIM, Eta DDIM: 0.2").eta, 0.2);
    EXPECT_FALSE(read("Sampler: Euler a, Eta DDIM: 0.2").eta.has_value());
    // Civitai's "Hashes: {...}" describes; settings at the web UI's defaults are honoured
    const auto h = read("Sampler: Euler a, Hashes: {\"model\": \"abc\", \"vae\": \"def\"}, Emphasis: Original, "
                        "Beta schedule alpha: 0.6");
    EXPECT_TRUE(h.unhonoured.empty()) << h.unhonoured.front();
    // a strength without its variation seed, a schedule the catalog has not, an unknown field: named
    const auto bad = read("Sampler: Euler a, Variation seed strength: 0.5, Face restoration: CodeFormer, NGMS: 0.5");
    EXPECT_EQ(bad.unhonoured,
              (std::vector<std::string>{"Face restoration: CodeFormer", "NGMS: 0.5", "Variation seed strength: 0.5"}));
    // malformed values stay errors, naming the field
    EXPECT_NE(sdtest::error_of([&] { read("Sampler: Euler a, Variation seed strength: 2"); })
                  .find("w.png: \"Variation seed strength\" must be a number from 0 to 1, got \"2\""),
              std::string::npos);
    EXPECT_NE(sdtest::error_of([&] { read("Sampler: Euler a, ENSD: lots"); }).find("\"ENSD\" must be a whole number"),
              std::string::npos);
    EXPECT_NE(sdtest::error_of([&] { read("Sampler: Euler a, Seed resize from: 256"); })
                  .find("\"Seed resize from\" must be WIDTHxHEIGHT"),
              std::string::npos);
}

// Schedules and samplers the catalog may gain: whatever it says, the answer comes from it.
TEST(WebUiTexts, SamplerNamesGoThroughTheCatalog) {
    const std::pair<const char*, const char*> names[] = {
        {"DPM++ 2M SDE Karras", "DPM++ 2M SDE"}, {"DPM++ 3M SDE Exponential", "DPM++ 3M SDE"},
        {"DPM2 a Karras", "DPM2 a"},             {"LMS Karras", "LMS"},
        {"DPM++ 2S a Karras", "DPM++ 2S a"},     {"Heun", "Heun"}};
    for (const auto& [text, sampler] : names) {
        const auto r = sd::parse_parameters_text(std::string("a\nSteps: 20, Sampler: ") + text + ", Seed: 1", "x.png");
        const std::string label = std::string(text).substr(std::string(sampler).size());
        const std::string schedule = label.empty() ? "default" : sd::schedule_from_a1111_name(label.substr(1));
        if (const sd::SamplerInfo* row = catalog_row(sampler, schedule)) {
            EXPECT_EQ(r.sampler, row->name) << text;
            EXPECT_EQ(r.schedule.value_or("default"), schedule) << text;
            EXPECT_TRUE(r.unhonoured.empty()) << text;
        } else {
            EXPECT_EQ(r.unhonoured, std::vector<std::string>{std::string("Sampler: ") + text});
        }
    }
    // one the web UI never had
    const auto r = sd::parse_parameters_text("a\nSteps: 20, Sampler: DPM++ 9M Karras, Seed: 1", "x.png");
    EXPECT_FALSE(r.sampler.has_value());
    EXPECT_FALSE(r.schedule.has_value());
    const std::string m = sdtest::error_of([&] { sd::check_honoured(r, "x.png", false); });
    EXPECT_NE(m.find("Sampler: DPM++ 9M Karras (its samplers: " + sd::sampler_choices() + ")"), std::string::npos) << m;
}

// Unclosed {...} values, many of them: read in one pass, each a plain value.
TEST(WebUiTexts, UnclosedObjectValuesStayLinear) {
    std::string fields;
    for (int i = 0; i < 200000; ++i) fields += ", K: {";
    const auto r = sd::parse_parameters_text("a\nSteps: 2, Sampler: Euler a" + fields + "}", "x.png");
    EXPECT_EQ(r.unhonoured.size(), 200000u);
    EXPECT_EQ(r.unhonoured.front(), "K: {");
}

// Refusal and --from-png-lenient: one line, at most 8 fields named, the rest counted.
TEST(WebUiTexts, ManyFieldsGiveOneShortLine) {
    std::string fields;
    for (int i = 0; i < 1000; ++i) fields += ", Extension field " + std::to_string(i) + ": " + std::string(100, 'v');
    const auto r = sd::parse_parameters_text("a\nSteps: 20, Sampler: Euler a" + fields, "x.png");
    EXPECT_EQ(r.unhonoured.size(), 1000u);
    const std::string m = sdtest::error_of([&] { sd::check_honoured(r, "x.png", false); });
    EXPECT_EQ(m.find('\n'), std::string::npos);
    EXPECT_LT(m.size(), 1000u);
    EXPECT_NE(m.find("Extension field 7: vvv"), std::string::npos);
    EXPECT_EQ(m.find("Extension field 8:"), std::string::npos);
    EXPECT_NE(m.find("and 992 more"), std::string::npos);
    EXPECT_NE(sd::check_honoured(r, "x.png", true).find("and 992 more"), std::string::npos);
}

// stable-diffusion.cpp's dialect: its sampler spelling, "RNG: cuda", "Eta: inf", "Guidance" and the SDCPP JSON.
TEST(SdcppText, FieldsAreMappedOrNamed) {
    const std::string json_tail =
        R"(, Version: stable-diffusion.cpp, SDCPP: {"mode":"img_gen","rng":"cuda","sampling":{"custom_sigmas":[],)"
        R"("eta":null,"extra_sample_args":"","flow_shift":null,"guidance":{"img_cfg":null,"slg":{"scale":0.0}},)"
        R"("shifted_timestep":0}})";
    auto read = [&](const std::string& fields, const std::string& tail) {
        return sd::parse_parameters_text("a cat\nSteps: 3, CFG scale: 7.000000, Guidance: 3.500000, Eta: inf, Seed: 42, "
                                         "Size: 64x96, Model: m.safetensors, " + fields + tail,
                                         "c.png");
    };
    const auto r = read("RNG: cuda, Sampler: euler_a karras", json_tail);
    EXPECT_EQ(r.writer, sd::TextWriter::sdcpp);
    EXPECT_TRUE(r.unhonoured.empty()) << r.unhonoured.front();
    EXPECT_EQ(r.sampler, "euler_a");
    EXPECT_EQ(r.schedule, "karras");
    EXPECT_EQ(r.rng, "nv");
    EXPECT_FALSE(r.eta.has_value());
    EXPECT_EQ(r.scale, 7.0);
    EXPECT_EQ(r.width, 64);
    EXPECT_EQ(r.height, 96);
    EXPECT_EQ(read("RNG: cpu, Sampler: euler discrete", json_tail).rng, "cpu");
    EXPECT_EQ(read("RNG: cuda, Sampler: euler discrete", json_tail).schedule, "default");
    // what it has that the web UI has not, and its own RNG
    EXPECT_EQ(read("RNG: std_default, Sampler: dpm2 karras", json_tail).unhonoured,
              (std::vector<std::string>{"RNG: std_default", "Sampler: dpm2 karras"}));
    EXPECT_EQ(read("RNG: cuda, Sampler: euler_a smoothstep", json_tail).unhonoured,
              std::vector<std::string>{"Sampler: euler_a smoothstep"});
    EXPECT_EQ(read("RNG: cuda, Sampler RNG: cpu, Sampler: euler_a karras", json_tail).unhonoured,
              std::vector<std::string>{"Sampler RNG: cpu"});
    // settings only the JSON shows
    const auto j = read("RNG: cuda, Sampler: euler_a karras",
                        R"(, Version: stable-diffusion.cpp, SDCPP: {"mode":"img_gen","sampling":{"custom_sigmas":[14.6,0],)"
                        R"("flow_shift":3.0,"guidance":{"slg":{"scale":2.5}}}})");
    EXPECT_EQ(j.unhonoured, (std::vector<std::string>{"SDCPP sampling/custom_sigmas", "SDCPP sampling/flow_shift",
                                                      "SDCPP sampling/guidance/slg/scale"}));
    EXPECT_EQ(read("RNG: cuda, Sampler: euler_a karras", R"(, SDCPP: {"mode":"vid_gen"})").unhonoured,
              std::vector<std::string>{"SDCPP mode: vid_gen"});
    // a JSON object that never closes is a plain value up to the next comma: not the SDCPP object
    EXPECT_EQ(read("RNG: cuda, Sampler: euler_a karras", R"(, SDCPP: {"mode":"img_gen")").unhonoured,
              std::vector<std::string>{"SDCPP: {\"mode\":\"img_gen\" (not its JSON object)"});
    // values of other types than its own are named, never an exception
    EXPECT_EQ(read("RNG: cuda, Sampler: euler_a karras", R"(, SDCPP: {"mode":5})").unhonoured,
              std::vector<std::string>{"SDCPP: {\"mode\":5} (not its JSON object)"});
    EXPECT_EQ(read("RNG: cuda, Sampler: euler_a karras", R"(, SDCPP: {"mode":"img_gen","sampling":"x","hires":[1]})")
                  .unhonoured,
              std::vector<std::string>{"SDCPP hires"});
}
