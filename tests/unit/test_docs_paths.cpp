// Every repository path that README.md and docs/*.md name must exist, and every
// link must reach its file and heading (issue 31): docs that name files from
// before a restructure send a new maintainer to nothing.
//
// What counts as a repository path, and from where it is resolved:
//  * a markdown link's target that is not a URL (`[x](memory.md)`,
//    `](../README.md#security)`): from the linking file's folder, as a renderer
//    does. A `#anchor` must be a heading of the target .md (GitHub's slug: lower
//    case, punctuation dropped, spaces to `-`, repeats numbered `-1`, `-2`).
//  * any other word, in prose, `code` or fenced blocks, that starts with one of
//    the repository's top-level folders and a slash (kTopFolders: src/, include/,
//    apps/, tests/, docs/, scripts/, python/, models/, bench/, .ci/), or is a root
//    file (kRootFiles): from the repository root, with its `#anchor` checked too.
//    A word ends at white space or at one of ` ( ) [ ] ; " ' = < > | * and ','
//    (after `{a,b}` is expanded: `x.{h,cpp}` names x.h and x.cpp); a leading ./,
//    a trailing . and anything from a ':' (`FILE:LINE`, `FILE:WEIGHT`) are dropped.
// Not checked, because the docs write them as examples, not as files of the tree:
//  * any other first folder: build/, outputs/, out/, ~/, ../shared/, /abs/paths;
//  * models/NAME when models/NAME is not a folder of the repository: the docs'
//    examples export users' checkpoints there (models/sd15, models/sdxl);
//  * a path from its first placeholder on (only the part before it is checked):
//    a component in capitals without a dot (SD15, OUTDIR, CASE), or one holding
//    "...", '$' or '{'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kTopFolders = {"src",    "include", "apps",   "tests", "docs",
                                              "scripts", "python",  "models", "bench", ".ci"};
const std::vector<std::string> kRootFiles = {"CMakeLists.txt", "README.md", ".gitignore"};

fs::path source_dir() { return sdtest::env("SD_SOURCE_DIR"); }

// README.md and docs/*.md, relative to the source folder, in a stable order.
std::vector<std::string> doc_files() {
    std::vector<std::string> out = {"README.md"};
    for (const auto& e : fs::directory_iterator(source_dir() / "docs"))
        if (e.is_regular_file() && e.path().extension() == ".md") out.push_back("docs/" + e.path().filename().string());
    std::sort(out.begin() + 1, out.end());
    return out;
}

std::vector<std::string> file_lines(const fs::path& p) {
    std::ifstream in(p);
    EXPECT_TRUE(in) << "cannot read " << p;
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool is_fence(const std::string& line) {
    const size_t i = line.find_first_not_of(' ');
    return i != std::string::npos && line.compare(i, 3, "```") == 0;
}

// The anchors GitHub gives the headings of a markdown file.
std::set<std::string> heading_anchors(const fs::path& md) {
    std::set<std::string> out;
    std::map<std::string, int> seen;
    bool fenced = false;
    for (const auto& line : file_lines(md)) {
        if (is_fence(line)) fenced = !fenced;
        if (fenced || !starts_with(line, "#")) continue;
        const size_t text = line.find_first_not_of('#');
        if (text == std::string::npos || line[text] != ' ') continue;
        const size_t first = line.find_first_not_of(' ', text), last = line.find_last_not_of(' ');
        if (first == std::string::npos) continue;
        std::string slug;
        for (size_t i = first; i <= last; ++i) {
            const unsigned char c = static_cast<unsigned char>(line[i]);
            if (std::isalnum(c) || c == '_' || c == '-' || c >= 0x80)
                slug += static_cast<char>(std::tolower(c));
            else if (c == ' ')
                slug += '-';
        }
        const int n = seen[slug]++;
        out.insert(n == 0 ? slug : slug + "-" + std::to_string(n));
    }
    return out;
}

// "" when `target` (relative to the source folder, maybe with #anchor) exists, else what is wrong.
std::string check_target(const std::string& target) {
    const size_t hash = target.find('#');
    const std::string path = target.substr(0, hash);
    const fs::path full = source_dir() / path;
    if (!fs::exists(full)) return "no such file or folder";
    if (hash == std::string::npos || full.extension() != ".md") return "";
    const std::string anchor = target.substr(hash + 1);
    return heading_anchors(full).count(anchor) ? "" : "no heading #" + anchor + " in " + path;
}

bool is_placeholder(const std::string& part) {
    if (part.find("...") != std::string::npos || part.find_first_of("${") != std::string::npos) return true;
    bool letter = false;
    for (const unsigned char c : part) {
        if (std::islower(c) || c == '.') return false;
        letter = letter || std::isupper(c);
    }
    return letter;
}

// The repository path a word names, cut before its first placeholder; "" when it names none.
std::string repo_path(std::string word) {
    if (starts_with(word, "./")) word.erase(0, 2);
    word = word.substr(0, word.find(':'));
    while (!word.empty() && word.back() == '.') word.pop_back();
    if (std::find(kRootFiles.begin(), kRootFiles.end(), word.substr(0, word.find('#'))) != kRootFiles.end())
        return word;
    const size_t slash = word.find('/');
    if (slash == std::string::npos) return "";
    if (std::find(kTopFolders.begin(), kTopFolders.end(), word.substr(0, slash)) == kTopFolders.end()) return "";
    std::vector<std::string> parts;
    std::stringstream ss(word);
    for (std::string part; std::getline(ss, part, '/');) parts.push_back(part);
    std::string kept;
    for (const auto& part : parts) {
        if (is_placeholder(part)) break;
        kept += (kept.empty() ? "" : "/") + part;
    }
    if (parts.size() >= 2 && parts[0] == "models" && !is_placeholder(parts[1]) &&
        !fs::is_directory(source_dir() / "models" / parts[1].substr(0, parts[1].find('#'))))
        return "";  // a user's export in an example
    return kept;
}

// Splits a line into words and expands {a,b}.
std::vector<std::string> words(const std::string& line) {
    std::vector<std::string> raw;
    std::string cur;
    for (const char c : line) {
        if (std::isspace(static_cast<unsigned char>(c)) || std::string("`()[];\"'=<>|*").find(c) != std::string::npos) {
            if (!cur.empty()) raw.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!cur.empty()) raw.push_back(cur);
    static const std::regex braces(R"(^(.*)\{([^{}]*,[^{}]*)\}(.*)$)");
    std::vector<std::string> out;
    for (const auto& w : raw) {
        std::vector<std::string> expanded = {w};
        std::smatch m;
        if (std::regex_match(w, m, braces)) {
            expanded.clear();
            std::stringstream alts(m[2].str());
            for (std::string alt; std::getline(alts, alt, ',');) expanded.push_back(m[1].str() + alt + m[3].str());
        }
        for (const auto& e : expanded) {
            std::stringstream ss(e);
            for (std::string piece; std::getline(ss, piece, ',');)
                if (!piece.empty()) out.push_back(piece);
        }
    }
    return out;
}

struct Named {
    std::string where;   // FILE:LINE
    std::string target;  // relative to the source folder
    std::string as_written;
};

// Every repository path and link target the docs name.
std::vector<Named> named_paths() {
    std::vector<Named> out;
    static const std::regex link(R"(\]\(([^)\s]+)\))");
    static const std::regex url("^[A-Za-z][A-Za-z0-9+.-]*:");
    for (const auto& doc : doc_files()) {
        const fs::path folder = fs::path(doc).parent_path();
        int n = 0;
        for (const auto& line : file_lines(source_dir() / doc)) {
            const std::string where = doc + ":" + std::to_string(++n);
            for (std::sregex_iterator it(line.begin(), line.end(), link), end; it != end; ++it) {
                const std::string t = (*it)[1].str();
                if (std::regex_search(t, url)) continue;
                const std::string resolved =
                    t[0] == '#' ? doc + t : (folder / t).lexically_normal().generic_string();
                out.push_back({where, resolved, "(" + t + ")"});
            }
            for (const auto& w : words(line)) {
                const std::string p = repo_path(w);
                if (!p.empty()) out.push_back({where, p, p});
            }
        }
    }
    return out;
}

TEST(DocsPaths, FindsPathsLinksAndPlaceholdersAsTheRuleSays) {
    // The rule itself, on made-up words: these are what the docs test relies on.
    EXPECT_EQ(repo_path("src/io/fs_util.h."), "src/io/fs_util.h");
    EXPECT_EQ(repo_path("./scripts/test.sh"), "scripts/test.sh");
    EXPECT_EQ(repo_path("src/io/fs_util.h:42"), "src/io/fs_util.h");
    EXPECT_EQ(repo_path("docs/memory.md#freed-block-reuse"), "docs/memory.md#freed-block-reuse");
    EXPECT_EQ(repo_path("tests/fixtures/tiny/cases_k/CASE/latents.npy"), "tests/fixtures/tiny/cases_k");
    EXPECT_EQ(repo_path("models/sd15"), "");       // an example export
    EXPECT_EQ(repo_path("models/clip/nope.txt"), "models/clip/nope.txt");
    EXPECT_EQ(repo_path("build/sd-txt2img"), "");  // not a folder of the repository
    EXPECT_EQ(repo_path("srcfoo/x.h"), "");
    EXPECT_EQ(repo_path("README.md"), "README.md");
    const auto w = words("see `src/io/json_depth.{h,cpp}`, (docs/cli.md) and [x](y)");
    EXPECT_NE(std::find(w.begin(), w.end(), "src/io/json_depth.h"), w.end());
    EXPECT_NE(std::find(w.begin(), w.end(), "src/io/json_depth.cpp"), w.end());
    EXPECT_NE(std::find(w.begin(), w.end(), "docs/cli.md"), w.end());
    const std::string md = sdtest::temp_dir() + "/headings.md";
    sdtest::write_text(md, "# Top\n## `--json` and exit codes\n```\n# not a heading\n```\n## A, b: c\n## A, b: c\n");
    EXPECT_EQ(heading_anchors(md),
              (std::set<std::string>{"top", "--json-and-exit-codes", "a-b-c", "a-b-c-1"}));
    EXPECT_EQ(check_target("README.md#no-such-heading-anywhere"), "no heading #no-such-heading-anywhere in README.md");
    EXPECT_EQ(check_target("src/no_such_file.cpp"), "no such file or folder");
}

TEST(DocsPaths, EveryPathAndLinkInTheDocsExists) {
    const auto named = named_paths();
    // The docs name well over a hundred; far fewer means the scan broke, not that the docs are clean.
    EXPECT_GT(named.size(), 100u);
    for (const auto& n : named) {
        const std::string problem = check_target(n.target);
        EXPECT_EQ(problem, "") << n.where << ": " << n.as_written << ": " << problem;
    }
}

}  // namespace
