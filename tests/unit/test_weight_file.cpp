// The weight file header (io/weight_file.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "test_util.h"
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>
#include <vector>

#include "io/weight_file.h"

namespace {

// A weight file as the export writes one (the safetensors layout): n fp32
// tensors of shapes [k + 1, 3], the header padded to 8 bytes.
void write_weight_file(const std::string& path, int n) {
    nlohmann::json header;
    uint64_t offset = 0;
    for (int k = 0; k < n; ++k) {
        const uint64_t bytes = static_cast<uint64_t>(k + 1) * 3 * 4;
        header["layer" + std::to_string(k) + ".weight"] = {
            {"dtype", "F32"}, {"shape", {k + 1, 3}}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    bytes += text;
    bytes.append(offset, '\x01');
    sdtest::write_text(path, bytes);
}

}  // namespace

// A weight file's header: the real one reads back; damaged ones (cuts at the
// header's edges and in the data, random bytes over the header, hand-made
// lies) give sd::Error, never a crash or a range past the file.
TEST(WeightIndex, ReadsTheExportAndRefusesDamage) {
    const std::string good = sdtest::temp_dir() + "/good.weights";
    write_weight_file(good, 12);
    const auto index = sd::read_weight_index(good);
    const auto size = std::filesystem::file_size(good);
    ASSERT_GT(index.size(), 10u);
    for (const auto& w : index) {
        EXPECT_LE(w.end, size) << w.name;
        EXPECT_EQ(w.begin % 4, 0u) << w.name << ": fp32 tensors, 4-byte aligned";
    }
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[i]);
    const std::string path = sdtest::temp_dir() + "/damaged.weights";
    auto refused = [&](const std::string& data) {
        sdtest::write_text(path, data);
        try {
            for (const auto& w : sd::read_weight_index(path))
                if (w.end > data.size()) return false;
            return true;  // a damage that left a valid header with every range inside the file
        } catch (const sd::Error& e) {
            return std::string(e.what()).find(path) != std::string::npos;
        }
    };
    for (size_t cut : {size_t{0}, size_t{7}, size_t{8}, size_t{100}, static_cast<size_t>(8 + header_len - 1),
                       static_cast<size_t>(8 + header_len), bytes.size() - 1})
        EXPECT_THROW(sd::read_weight_index((sdtest::write_text(path, bytes.substr(0, cut)), path)), sd::Error) << cut;
    std::mt19937 rng(7);
    for (int i = 0; i < 300; ++i) {
        std::string d = bytes.substr(0, 8 + header_len + 64);
        for (int k = 0; k < 1 + i % 5; ++k) d[8 + rng() % header_len] = static_cast<char>(rng() % 256);
        EXPECT_TRUE(refused(d)) << i;
    }
    const std::string head = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
    auto file = [](std::string h, size_t data) {
        h += std::string((8 - h.size() % 8) % 8, ' ');  // data 8-byte aligned, as the export pads it
        std::string f(8, '\0');
        for (int i = 0; i < 8; ++i) f[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
        return f + h + std::string(data, '\0');
    };
    EXPECT_TRUE(refused(file(head, 16)));
    EXPECT_NO_THROW(sd::read_weight_index((sdtest::write_text(path, file(head, 16)), path)));
    for (const std::string& lie : {R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})",
                                   R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})",
                                   R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})",
                                   R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}})",
                                   R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})",
                                   R"({"w":{"dtype":"F16","shape":[1],"data_offsets":[1,3]}})",
                                   R"({"w":{"dtype":"F32","shape":[2,2]}})", R"([1,2])", R"({"w":7})"})
        EXPECT_THROW(sd::read_weight_index((sdtest::write_text(path, file(lie, 16)), path)), sd::Error) << lie;
}

// parse_weight_index (the fuzz harness's entry point) is read_weight_index on
// bytes in memory: the same entries, or the same message, for the export, its
// cuts and random damage.
TEST(WeightIndex, FromMemoryAsFromTheFile) {
    const std::string path = sdtest::temp_dir() + "/w.weights";
    write_weight_file(path, 5);
    std::ifstream in(path, std::ios::binary);
    const std::string good((std::istreambuf_iterator<char>(in)), {});
    auto outcome = [&](auto read) {
        std::string r;
        try {
            for (const auto& w : read())
                r += w.name + w.dtype + std::to_string(w.shape.size()) + ":" + std::to_string(w.begin) + "-" +
                     std::to_string(w.end) + ";";
        } catch (const sd::Error& e) {
            r = std::string("error: ") + e.what();
        }
        return r;
    };
    std::mt19937 rng(11);
    std::vector<std::string> inputs = {good, good.substr(0, 5), good.substr(0, 8), good.substr(0, 40), ""};
    for (int i = 0; i < 100; ++i) {
        std::string d = good;
        d[rng() % 120] = static_cast<char>(rng() % 256);
        inputs.push_back(d);
    }
    int errors = 0;
    for (const auto& d : inputs) {
        sdtest::write_text(path, d);
        const std::string from_file = outcome([&] { return sd::read_weight_index(path); });
        EXPECT_EQ(outcome([&] { return sd::parse_weight_index(d, path); }), from_file);
        errors += from_file.rfind("error: ", 0) == 0;
    }
    EXPECT_GT(errors, 10);                  // the damage was seen...
    EXPECT_LT(errors, int(inputs.size()));  // ...and the good file read
}

namespace {

// A file of (name, dtype, shape) tensors, each at the next offset (F16 before I8: aligned).
std::string q8_file(const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>& tensors) {
    nlohmann::json header;
    uint64_t offset = 0;
    for (const auto& [name, dtype, shape] : tensors) {
        uint64_t n = static_cast<uint64_t>(sd::dtype_size(dtype));
        for (int64_t s : shape) n *= static_cast<uint64_t>(s);
        header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
        offset += n;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    return bytes + text + std::string(offset, '\x02');
}

std::string refusal(const std::string& bytes) {
    try {
        sd::parse_weight_index(bytes, "m/unet.weights");
    } catch (const sd::Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

// --dtype q8_0 files: an I8 weight is mapped only beside its F16 scales [rows, row / 32];
// anything else is refused in one line naming the file and the tensor.
TEST(WeightIndex, EightBitWeightsComeWithTheirScales) {
    using T = std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>;
    const auto good = sd::parse_weight_index(
        q8_file({{"l.bias", "F32", {4}}, {"l.weight_scale", "F16", {4, 2}}, {"l.weight", "I8", {4, 64}},
                 {"c.weight_scale", "F16", {2, 9}}, {"c.weight", "I8", {2, 32, 3, 3}}}),
        "m/unet.weights");
    EXPECT_EQ(good.size(), 5u);
    // A copied file (a LoRA) may hold I8 as any other type, without scales.
    EXPECT_NO_THROW(sd::parse_weight_index(q8_file({{"x", "I8", {3}}}), "a.safetensors", sd::WeightUse::AnyDtype));
    const std::vector<std::pair<T, std::string>> bad = {
        {{{"l.weight", "I8", {4, 64}}}, "'l.weight': I8 without its F16 scales l.weight_scale"},
        {{{"l.weight_scale", "F32", {4, 2}}, {"l.weight", "I8", {4, 64}}},
         "'l.weight': its scales l.weight_scale are F32 [4,2], not F16 [4,2]"},
        {{{"l.weight_scale", "F16", {4, 1}}, {"l.weight", "I8", {4, 64}}},
         "'l.weight': its scales l.weight_scale are F16 [4,1], not F16 [4,2]"},
        {{{"l.weight_scale", "F16", {4, 2}}, {"l.weight", "F32", {4, 64}}},
         "'l.weight_scale': scales without an I8 weight l.weight"},
        {{{"l.bias", "I8", {32}}}, "'l.bias': I8 is only for a layer's .weight"},
        {{{"l.weight_scale", "F16", {4}}, {"l.weight", "I8", {128}}}, "'l.weight': an I8 weight needs rows"},
        {{{"l.weight_scale", "F16", {4, 1}}, {"l.weight", "I8", {4, 16}}},
         "'l.weight': I8 rows of 16 values are not whole blocks of 32"},
        {{{"l.weight_scale", "F16", {0, 2}}, {"l.weight", "I8", {0, 64}}}, "'l.weight': an I8 weight needs rows"},
    };
    for (const auto& [tensors, want] : bad) {
        const std::string got = refusal(q8_file(tensors));
        EXPECT_NE(got.find("weights file m/unet.weights is corrupt: tensor " + want), std::string::npos) << got;
        EXPECT_EQ(got.find('\n'), std::string::npos) << got;
    }
}

// A header's "__metadata__" strings (a LoRA's kohya alias), read within the header's bounds.
TEST(WeightIndex, MetadataStringsAreRead) {
    const std::string path = sdtest::temp_dir() + "/meta.safetensors";
    const auto file_with = [&](std::string h) {
        h.append((8 - h.size() % 8) % 8, ' ');
        std::string f(8, '\0');
        for (int i = 0; i < 8; ++i) f[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
        sdtest::write_text(path, f + h);
        return path;
    };
    const auto m = sd::read_weight_metadata(
        file_with(R"({"__metadata__":{"ss_output_name":"add_detail","ss_network_dim":"32","n":5,"o":{}}})"));
    EXPECT_EQ(m, (std::map<std::string, std::string>{{"ss_output_name", "add_detail"}, {"ss_network_dim", "32"}}));
    EXPECT_TRUE(sd::read_weight_metadata(file_with(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})")).empty());
    EXPECT_TRUE(sd::read_weight_metadata(file_with(R"({"__metadata__":[1,2]})")).empty());
    for (const std::string bad : {std::string("[1,2]"), std::string("{\"a\":"), std::string("not json")})
        EXPECT_THROW(sd::read_weight_metadata(file_with(bad)), sd::Error) << bad;
    sdtest::write_text(path, std::string("\xff\xff\xff\xff\xff\xff\xff\x00{}", 10));  // a header longer than the file
    EXPECT_THROW(sd::read_weight_metadata(path), sd::Error);
    EXPECT_THROW(sd::read_weight_metadata(sdtest::temp_dir()), sd::Error);  // a folder
}
