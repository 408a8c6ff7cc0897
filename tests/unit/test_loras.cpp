// A1111's <lora:NAME:W> prompt tags (sd/loras.h), --lora FILE[:W], and
// what a run's plan makes of them: LoRA sets per prompt, batches that never
// mix sets, and the PNG text (run/batch_plan.h).
#include <gtest/gtest.h>

#include <filesystem>

#include "run/batch_plan.h"
#include "sd/error.h"
#include "sd/from_png.h"
#include "sd/loras.h"
#include "test_util.h"

TEST(LoraTags, FoundInOrderWithTheirWeights) {
    const auto tags = sd::find_lora_tags("a <lora:one> cat <lora: two :0.5>, <lora:three:0.3:0.9> <lora:four:unet=0.2:te=0.1>", "p");
    ASSERT_EQ(tags.size(), 4u);
    EXPECT_EQ(tags[0].name, "one");
    EXPECT_EQ(tags[0].text_weight, 1.0);
    EXPECT_EQ(tags[0].unet_weight, 1.0);
    EXPECT_EQ(tags[1].name, "two");
    EXPECT_EQ(tags[1].text_weight, 0.5);
    EXPECT_EQ(tags[1].unet_weight, 0.5);
    EXPECT_EQ(tags[2].text_weight, 0.3);
    EXPECT_EQ(tags[2].unet_weight, 0.9);
    EXPECT_EQ(tags[3].text_weight, 0.1);
    EXPECT_EQ(tags[3].unet_weight, 0.2);
    EXPECT_TRUE(sd::find_lora_tags("no tags <hypernet:x:1> (a:1.2) <lora:unclosed", "p").empty());
}

// A1111 registers "lyco" as another name of its LoRA network: <lyco:NAME:W> is a LoRA tag.
TEST(LoraTags, LycoTagsAreLoraTags) {
    const auto tags = sd::find_lora_tags("<lyco:one:0.5> a cat <lora:two> <lyco:three:0.2:0.4>", "p");
    ASSERT_EQ(tags.size(), 3u);
    EXPECT_EQ(tags[0].name, "one");
    EXPECT_EQ(tags[0].unet_weight, 0.5);
    EXPECT_EQ(tags[1].name, "two");
    EXPECT_EQ(tags[2].name, "three");
    EXPECT_EQ(tags[2].unet_weight, 0.4);
    EXPECT_EQ(sd::strip_network_tags("a <lyco:x:0.5>cat<lora:y> on a mat"), "a cat on a mat");
}

// Every extra-network tag leaves the text, as A1111's re_extra_net (<word:args>) finds them:
// LoRA tags and any other type, which are not applied and are listed for the run's warning.
TEST(LoraTags, StrippedFromTheTextTheEncoderSees) {
    EXPECT_EQ(sd::strip_network_tags("a <lora:x:0.5>cat<lora:y> on a mat"), "a cat on a mat");
    EXPECT_EQ(sd::strip_network_tags("<hypernet:z:1> a <lora:open"), " a <lora:open");
    EXPECT_EQ(sd::strip_network_tags("a <x:> b <:y> c <a b:1> d <<lora:n:1>> e"), "a <x:> b <:y> c <a b:1> d <> e");
    EXPECT_EQ(sd::strip_network_tags("<lyco:a:1><hypernet:h><Foo_2:bar baz>!"), "!");
    EXPECT_EQ(sd::strip_network_tags("<hypernet:a <lora:b:1> c"), " c");  // one tag, as A1111's regex reads it
    EXPECT_EQ(sd::unapplied_network_tags("<hypernet:a <lora:b:1> c <lora:d> <lyco:e> <hypernet:f:0.5>"),
              (std::vector<std::string>{"<hypernet:a <lora:b:1>", "<hypernet:f:0.5>"}));
    EXPECT_TRUE(sd::find_lora_tags("<hypernet:a <lora:b:1> c", "p").empty());
}

namespace {

// The one-line refusal of a prompt (line 2 of f.txt) whose tag names a LoRA below dir; "" if none.
std::string tag_refusal(const std::string& prompt, const std::string& dir) {
    try {
        sd::prompt_loras(prompt, "f.txt:2", dir, {});
    } catch (const sd::Error& e) {
        return e.what();
    }
    ADD_FAILURE() << prompt << " was not refused";
    return "";
}

}  // namespace

// A tag finds NAME.safetensors in --lora-dir, else in its subfolders, as A1111 does; a name
// two files below it share is refused naming both, and one in the folder itself wins.
TEST(LoraTags, FoundInSubfoldersOfTheLoraDir) {
    const std::string dir = sdtest::temp_dir();
    std::filesystem::create_directories(dir + "/style/old");
    std::filesystem::create_directories(dir + "/chars");
    for (const char* f : {"/style/ink.safetensors", "/style/old/twin.safetensors", "/chars/twin.safetensors",
                          "/top.safetensors", "/chars/top.safetensors", "/chars/note.txt"})
        sdtest::write_text(dir + f, "x");
    const auto path_of = [&](const std::string& tag) { return sd::prompt_loras("a " + tag, "p", dir, {}).at(0).path; };
    EXPECT_EQ(path_of("<lora:ink:0.5>"), dir + "/style/ink.safetensors");
    EXPECT_EQ(path_of("<lyco:ink>"), dir + "/style/ink.safetensors");
    EXPECT_EQ(path_of("<lora:top>"), dir + "/top.safetensors");
    EXPECT_EQ(path_of("<lora:none>"), dir + "/none.safetensors");  // left for "does not exist"
    EXPECT_EQ(path_of("<lora:note>"), dir + "/note.safetensors");
    const std::string m = tag_refusal("<lora:twin>", dir);
    EXPECT_EQ(m.rfind("f.txt:2: <lora:twin> matches 2 files below ", 0), 0u) << m;
    EXPECT_NE(m.find("chars/twin.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("style/old/twin.safetensors"), std::string::npos) << m;
}

// A name no file has is looked up among the files' A1111 aliases (their "ss_output_name"):
// a file name wins over an alias, an alias two files share is refused naming both, and
// files whose header cannot be read are passed over.
TEST(LoraTags, FoundByTheirAliasAfterTheirFileNames) {
    const std::string dir = sdtest::temp_dir();
    std::filesystem::create_directories(dir + "/sub");
    const auto with_alias = [&](const std::string& file, const std::string& alias) {
        std::string header = R"({"__metadata__":{"ss_output_name":")" + alias + R"(","ss_network_dim":"8"}})";
        header.append((8 - header.size() % 8) % 8, ' ');
        std::string len(8, '\0');
        for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(header.size() >> (8 * i));
        sdtest::write_text(dir + file, len + header);
    };
    with_alias("/sub/detail_v2-000010.safetensors", "add_detail");
    with_alias("/ink.safetensors", "add_ink");
    with_alias("/sub/add_ink.safetensors", "something_else");  // a file named add_ink wins over ink's alias
    with_alias("/a.safetensors", "twin");
    with_alias("/sub/b.safetensors", "twin");
    sdtest::write_text(dir + "/sub/broken.safetensors", "not a safetensors file");
    const auto path_of = [&](const std::string& tag) { return sd::prompt_loras("a " + tag, "p", dir, {}).at(0).path; };
    EXPECT_EQ(path_of("<lora:add_detail:0.5>"), dir + "/sub/detail_v2-000010.safetensors");
    EXPECT_EQ(sd::prompt_loras("<lora:add_detail>", "p", dir, {}).at(0).name, "add_detail");  // the PNG text's name
    EXPECT_EQ(path_of("<lora:add_ink>"), dir + "/sub/add_ink.safetensors");
    EXPECT_EQ(path_of("<lora:ink>"), dir + "/ink.safetensors");
    EXPECT_EQ(path_of("<lora:nothing>"), dir + "/nothing.safetensors");  // left for "does not exist"
    const std::string m = tag_refusal("<lora:twin>", dir);
    EXPECT_EQ(m.rfind("f.txt:2: <lora:twin> is the alias (ss_output_name) of 2 files below ", 0), 0u) << m;
    EXPECT_NE(m.find("/a.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("sub/b.safetensors"), std::string::npos) << m;
}

TEST(LoraTags, BadTagsAreOneLineNamingThePrompt) {
    for (const char* p : {"<lora:x:abc>", "<lora::1>", "<lora:a/b:1>", "<lora:x:1:2:3>", "<lora:x:inf>"}) {
        try {
            sd::find_lora_tags(p, "f.txt:3");
            ADD_FAILURE() << p;
        } catch (const sd::Error& e) {
            EXPECT_EQ(std::string(e.what()).rfind("f.txt:3: ", 0), 0u) << e.what();
        }
    }
}

// Issue 32: weights are finite and within +-100, refused where they are written.
TEST(LoraTags, WeightsOutOfRangeAreRefusedWhereWritten) {
    for (const char* p : {"<lora:x:1e300>", "<lora:x:3.5e38>", "<lora:x:-101>", "<lora:x:1:nan>", "<lora:x:te=1e30>"}) {
        try {
            sd::find_lora_tags(p, "f.txt:3");
            ADD_FAILURE() << p;
        } catch (const sd::Error& e) {
            EXPECT_EQ(std::string(e.what()).rfind(std::string("f.txt:3: ") + p, 0), 0u) << e.what();
        }
    }
    EXPECT_EQ(sd::find_lora_tags("<lora:x:-100>", "f").at(0).text_weight, -100);
    for (const char* flag : {"good.safetensors:1e300", "good.safetensors:nan", "good.safetensors:-inf"}) {
        try {
            sd::parse_lora_flag(flag);
            ADD_FAILURE() << flag;
        } catch (const sd::Error& e) {
            const std::string m = e.what();
            EXPECT_EQ(m.rfind(std::string("--lora ") + flag + ": the weight", 0), 0u) << m;
        }
    }
    try {
        sd::parse_lora_flag("f:nan");
        ADD_FAILURE();
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("is not a number"), std::string::npos) << e.what();
    }
    EXPECT_EQ(sd::parse_lora_flag("dir/x:y.safetensors").path, "dir/x:y.safetensors");  // not a number: part of the name
}

TEST(LoraTags, FlagTakesATrailingWeight) {
    auto a = sd::parse_lora_flag("dir/my:style.safetensors:0.7");
    EXPECT_EQ(a.path, "dir/my:style.safetensors");
    EXPECT_EQ(a.name, "my:style");
    EXPECT_EQ(a.unet_weight, 0.7);
    auto b = sd::parse_lora_flag("x.safetensors");
    EXPECT_EQ(b.path, "x.safetensors");
    EXPECT_EQ(b.text_weight, 1.0);
    EXPECT_THROW(sd::parse_lora_flag(":0.5"), sd::Error);
    EXPECT_EQ(sd::lora_tag_text("n", 0.5, 0.5), "<lora:n:0.5>");
    EXPECT_EQ(sd::lora_tag_text("n", 1, 0.25), "<lora:n:1:0.25>");
}

namespace {
sd::Txt2ImgJob tagged_job(const std::string& text) {
    sd::Txt2ImgJob job;
    job.prompts = sd::parse_prompts(text, "p.txt", false);
    job.from_file = true;
    job.n_samples = 4;
    job.lora_dir = "loras";
    job.loras = {sd::parse_lora_flag("base.safetensors:0.5")};
    return job;
}
}  // namespace

// The tags first, then --lora's files (the PNG text's order); prompts with another set start another batch.
TEST(LoraPlan, BatchesNeverMixLoraSets) {
    const auto plan = sd::plan_run(tagged_job("a <lora:s:1>\nb <lora:s:1>\nc\nd <lora:s:0.5>\n"));
    ASSERT_EQ(plan.batches.size(), 3u);
    EXPECT_EQ(plan.batches[0].images.size(), 2u);
    const auto& l = plan.items[0].settings.loras;
    ASSERT_EQ(l.size(), 2u);
    EXPECT_EQ(l[1].path, "base.safetensors");
    EXPECT_EQ(l[0].path, "loras/s.safetensors");
    EXPECT_TRUE(l[0].from_tag);
    EXPECT_EQ(plan.items[2].settings.loras.size(), 1u);
    EXPECT_EQ(plan.items[3].settings.loras[0].text_weight, 0.5);
}

TEST(LoraPlan, TagWithoutLoraDirIsRefused) {
    auto job = tagged_job("a <lora:s:1>\n");
    job.lora_dir.clear();
    try {
        sd::plan_run(job);
        ADD_FAILURE();
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("--lora-dir"), std::string::npos) << e.what();
        EXPECT_EQ(std::string(e.what()).rfind("p.txt:1", 0), 0u) << e.what();
    }
}

// A1111's text: the tags stay in the prompt (--lora's files added as tags), "Lora hashes" lists them;
// --from-png reads the prompt back with its tags.
TEST(LoraPlan, ParametersTextRecordsLorasAsA1111) {
    auto plan = sd::plan_run(tagged_job("a cat <lora:s:0.8>\n"));
    auto& item = plan.items[0];
    item.settings.loras[1].hash = "0123456789ab";
    item.settings.loras[0].hash = "ba9876543210";
    const std::string text = sd::parameters_text(item, plan.batches[0].images[0], sd::SeedMode::compvis, "m");
    EXPECT_EQ(text.substr(0, text.find('\n')), "a cat <lora:s:0.8> <lora:base:0.5>");
    EXPECT_NE(text.find(", Lora hashes: \"s: ba9876543210, base: 0123456789ab\","), std::string::npos) << text;
    const auto back = sd::parse_parameters_text(text, "x.png");
    EXPECT_EQ(back.prompt, "a cat <lora:s:0.8> <lora:base:0.5>");
}
