#include "io/weight_file.h"

#include <fstream>
#include <limits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "io/fs_util.h"
#include "io/printable.h"
#include "sd/error.h"

namespace sd {

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the safetensors format's own limit
constexpr int64_t kQ8Block = 32;

uint64_t element_size(const std::string& dtype, WeightUse use) {
    if (use == WeightUse::Mapped)
        return dtype == "F32" ? 4 : (dtype == "F16" || dtype == "BF16") ? 2 : dtype == "I8" ? 1 : 0;
    return static_cast<uint64_t>(dtype_size(dtype));
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string out = "[";
    for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
    return out + "]";
}

int dtype_size(const std::string& dtype) {
    if (dtype == "F64" || dtype == "I64") return 8;
    if (dtype == "F32" || dtype == "I32") return 4;
    if (dtype == "F16" || dtype == "BF16" || dtype == "I16") return 2;
    if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
    return 0;
}

std::string weight_file_for(const std::string& stage_path) {
    const auto slash = stage_path.find_last_of('/');
    const auto dot = stage_path.find_last_of('.');
    const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
    return (has_ext ? stage_path.substr(0, dot) : stage_path) + ".weights";
}

namespace {

Error corrupt(const std::string& path, const std::string& why) {
    return Error("weights file " + path + " is corrupt: " + why);
}

// The header's length from the file's first 8 bytes (little-endian), checked
// against the file's size.
uint64_t header_length(const unsigned char* len_bytes, uint64_t size, const std::string& path) {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];
    if (header_len > kMaxHeader || header_len > size - 8) throw corrupt(path, "header length past the end of the file");
    return header_len;
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A mapped file's 8-bit layers (a --dtype q8_0 export, docs/model-format.md): each I8
// `L.weight` goes with an F16 `L.weight_scale` of [rows, row / 32], GGUF q8_0's blocks of 32
// values along each output row. Neither may come alone or in another shape: the layer would
// expand it into a wrong weight, or read past its scales.
void check_q8_pairs(const std::vector<WeightEntry>& entries, const std::string& path) {
    std::unordered_map<std::string, const WeightEntry*> by_name;
    for (const auto& w : entries) by_name[w.name] = &w;
    for (const auto& w : entries) {
        const auto bad = [&](const std::string& why) {
            return corrupt(path, "tensor '" + printable(w.name) + "': " + why);
        };
        if (w.dtype == "I8") {
            if (!ends_with(w.name, ".weight")) throw bad("I8 is only for a layer's .weight (8-bit blocks)");
            if (w.shape.size() < 2 || w.shape[0] == 0)
                throw bad("an I8 weight needs rows: its shape is " + shape_text(w.shape));
            int64_t row = 1;
            for (size_t i = 1; i < w.shape.size(); ++i) row *= w.shape[i];  // bounded by the file size
            if (row == 0 || row % kQ8Block != 0)
                throw bad("I8 rows of " + std::to_string(row) + " values are not whole blocks of 32");
            const auto it = by_name.find(w.name + "_scale");
            const std::vector<int64_t> want = {w.shape[0], row / kQ8Block};
            if (it == by_name.end()) throw bad("I8 without its F16 scales " + printable(w.name) + "_scale");
            if (it->second->dtype != "F16" || it->second->shape != want)
                throw bad("its scales " + printable(w.name) + "_scale are " + it->second->dtype + " " +
                          shape_text(it->second->shape) + ", not F16 " + shape_text(want));
        } else if (ends_with(w.name, ".weight_scale")) {
            const auto it = by_name.find(w.name.substr(0, w.name.size() - 6));
            if (it == by_name.end() || it->second->dtype != "I8")
                throw bad("scales without an I8 weight " + printable(w.name.substr(0, w.name.size() - 6)));
        }
    }
}

// The entries of a header (its JSON text) in a file of `size` bytes.
std::vector<WeightEntry> parse_header(const std::string& header, uint64_t size, const std::string& path,
                                      WeightUse use) {
    const uint64_t data_start = 8 + header.size(), data_size = size - data_start;
    nlohmann::json index;
    try {
        index = nlohmann::json::parse(header);
    } catch (const nlohmann::json::exception&) {
        throw corrupt(path, "its header is not JSON");
    }
    if (!index.is_object()) throw corrupt(path, "its header is not a JSON object");
    std::vector<WeightEntry> out;
    for (const auto& item : index.items()) {
        // Named, not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
        const std::string& name = item.key();
        const auto& e = item.value();
        if (name == "__metadata__") continue;
        const auto bad = [&](const std::string& why) {
            return corrupt(path, "tensor '" + printable(name) + "': " + why);
        };
        if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
            throw bad("needs dtype, shape and data_offsets");
        const auto& dtype = e["dtype"];
        const auto& shape = e["shape"];
        const auto& offsets = e["data_offsets"];
        if (!dtype.is_string() || element_size(dtype.get<std::string>(), use) == 0)
            throw bad(use == WeightUse::Mapped ? "dtype is not F32, F16, BF16 or I8" : "unknown dtype");
        if (!shape.is_array() || shape.size() > 8) throw bad("shape is not a list of at most 8 sizes");
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
            !offsets[1].is_number_unsigned())
            throw bad("data_offsets is not [begin, end]");
        WeightEntry w;
        w.name = name;
        w.dtype = dtype.get<std::string>();
        const uint64_t elem = element_size(w.dtype, use);
        uint64_t count = 1;
        for (const auto& d : shape) {
            if (!d.is_number_unsigned()) throw bad("shape has a size that is not a non-negative integer");
            const uint64_t n = d.get<uint64_t>();
            if (n != 0 && count > data_size / n) throw bad("shape larger than the file");
            count *= n;
            w.shape.push_back(static_cast<int64_t>(n));
        }
        const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
        if (begin > end || end > data_size) throw bad("data_offsets past the end of the file");
        if (end - begin != count * elem) throw bad("data_offsets do not match its shape and dtype");
        if (use == WeightUse::Mapped && (data_start + begin) % elem != 0)
            throw bad("data not aligned to its element size");
        w.begin = data_start + begin;
        w.end = data_start + end;
        out.push_back(std::move(w));
    }
    if (use == WeightUse::Mapped) check_q8_pairs(out, path);
    return out;
}

}  // namespace

std::vector<WeightEntry> parse_weight_header(const std::string& header, uint64_t file_size, const std::string& path,
                                             WeightUse use) {
    if (file_size < 8 || header.size() > file_size - 8) throw corrupt(path, "header length past the end of the file");
    return parse_header(header, file_size, path, use);
}

namespace {

// A file's header text (its length checked against the file's size), and the size.
std::string read_header_text(const std::string& path, uint64_t& size) {
    check_regular_file(path, "weights file");  // a FIFO or /dev/zero would block or spin
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw Error("cannot read weights file " + path);
    size = static_cast<uint64_t>(f.tellg());
    f.seekg(0);
    unsigned char len_bytes[8];
    if (size < 8 || !f.read(reinterpret_cast<char*>(len_bytes), 8)) throw corrupt(path, "shorter than its header");
    const uint64_t header_len = header_length(len_bytes, size, path);
    std::string header(header_len, '\0');
    if (!f.read(header.data(), static_cast<std::streamsize>(header_len))) throw corrupt(path, "cannot read its header");
    return header;
}

}  // namespace

std::vector<WeightEntry> read_weight_index(const std::string& path, WeightUse use) {
    uint64_t size = 0;
    const std::string header = read_header_text(path, size);
    return parse_header(header, size, path, use);
}

std::map<std::string, std::string> read_weight_metadata(const std::string& path) {
    uint64_t size = 0;
    const std::string header = read_header_text(path, size);
    const nlohmann::json index = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) throw corrupt(path, "its header is not a JSON object");
    std::map<std::string, std::string> out;
    const auto m = index.find("__metadata__");
    if (m == index.end() || !m->is_object()) return out;
    for (const auto& item : m->items())
        if (item.value().is_string()) out[item.key()] = item.value().get<std::string>();
    return out;
}

std::vector<WeightEntry> parse_weight_index(const std::string& file_bytes, const std::string& path, WeightUse use) {
    const uint64_t size = file_bytes.size();
    if (size < 8) throw corrupt(path, "shorter than its header");
    const uint64_t header_len = header_length(reinterpret_cast<const unsigned char*>(file_bytes.data()), size, path);
    return parse_header(file_bytes.substr(8, header_len), size, path, use);
}

}  // namespace sd
