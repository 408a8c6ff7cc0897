// docs/cli.md documents exactly the flags `sd-txt2img --help` lists (issue 31):
// a flag added to the tool without a row there, or a row left after its flag
// went, fails here. The documented flags are those in the first column of
// docs/cli.md's tables (`--steps N` (`--ddim_steps`) documents both names); a
// flag named elsewhere in its prose (the export's `--guidance-scale`, say) is
// not a row. --help needs no model and loads no engine.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>

#include "test_util.h"

namespace {

// Every name --help lists: the option column of CLI11's help ("  --steps,--ddim_steps UINT [50]  ...").
std::set<std::string> help_flags() {
    const auto r = sdtest::run({sdtest::cli(), "--help"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::set<std::string> out;
    static const std::regex names(R"(^\s+(-[-A-Za-z0-9_]+(?:,\s*-[-A-Za-z0-9_]+)*))");
    static const std::regex name(R"(-[-A-Za-z0-9_]+)");
    for (const auto& line : sdtest::lines(r.out)) {
        std::smatch m;
        if (!std::regex_search(line, m, names)) continue;
        const std::string list = m[1].str();
        for (std::sregex_iterator it(list.begin(), list.end(), name), end; it != end; ++it) out.insert(it->str());
    }
    return out;
}

// The first cell of a table row, with `\|` (a bar inside code) not ending it.
std::string first_cell(const std::string& line) {
    size_t i = line.find('|') + 1;
    std::string cell;
    for (; i < line.size() && line[i] != '|'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') ++i;
        cell += line[i];
    }
    return cell;
}

// The flags docs/cli.md's tables document: each `code` span of a row's first cell that starts with a flag.
std::set<std::string> documented_flags() {
    const std::string path = sdtest::env("SD_SOURCE_DIR") + "/docs/cli.md";
    EXPECT_TRUE(std::filesystem::is_regular_file(path)) << path;
    std::set<std::string> out;
    static const std::regex span(R"(`(-{1,2}[A-Za-z0-9][-A-Za-z0-9_]*)[^`]*`)");
    for (const auto& line : sdtest::lines(sdtest::read_text(path))) {
        if (line.rfind("|", 0) != 0) continue;
        const std::string cell = first_cell(line);
        for (std::sregex_iterator it(cell.begin(), cell.end(), span), end; it != end; ++it) out.insert((*it)[1].str());
    }
    return out;
}

TEST(DocsCli, ReadsBothListsAsTheRuleSays) {
    EXPECT_EQ(first_cell("| `--attention auto\\|fused` | auto | x |"), " `--attention auto|fused` ");
    const auto help = help_flags();
    // Names the tool has had from the start: an empty or garbled parse must not pass.
    for (const char* f : {"--help", "--prompt", "--steps", "--ddim_steps", "--model", "--seed"})
        EXPECT_TRUE(help.count(f)) << f << " not found in --help's output";
    const auto documented = documented_flags();
    for (const char* f : {"--prompt", "--steps", "--ddim_steps"})
        EXPECT_TRUE(documented.count(f)) << f << " not found in docs/cli.md's tables";
}

TEST(DocsCli, EveryFlagOfHelpIsInCliMd) {
    const auto documented = documented_flags();
    for (const auto& f : help_flags())
        EXPECT_TRUE(documented.count(f)) << "sd-txt2img --help lists " << f
                                          << ", docs/cli.md has no table row for it: add one";
}

TEST(DocsCli, EveryFlagOfCliMdIsInHelp) {
    const auto help = help_flags();
    for (const auto& f : documented_flags())
        EXPECT_TRUE(help.count(f)) << "docs/cli.md documents " << f << ", which sd-txt2img --help does not list";
}

}  // namespace
