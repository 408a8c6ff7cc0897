#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "io/fs_util.h"
#include "sd/error.h"

namespace sd {

int64_t NpyArray::numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
}

size_t NpyArray::item_size() const {
    if (dtype == "<f4" || dtype == "<i4") return 4;
    if (dtype == "<i8" || dtype == "<f8") return 8;
    if (dtype == "|u1") return 1;
    return 0;
}

static std::string field_value(const std::string& header, const std::string& key) {
    auto pos = header.find("'" + key + "'");
    if (pos == std::string::npos) return {};
    pos = header.find(':', pos);
    if (pos == std::string::npos) return {};
    ++pos;
    while (pos < header.size() && header[pos] == ' ') ++pos;
    if (pos >= header.size()) return {};
    char open = header[pos];
    char close = open == '\'' ? '\'' : open == '(' ? ')' : ',';
    auto end = header.find(close, pos + 1);
    if (end == std::string::npos) return {};
    return header.substr(pos, end - pos + 1);
}

NpyArray read_npy(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot open " + path);
    char magic[8];
    if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error(path + ": not a .npy file");
    uint32_t header_len = 0;
    if (magic[6] == 1) {
        unsigned char b[2];
        if (!in.read(reinterpret_cast<char*>(b), 2)) throw Error(path + ": truncated .npy header");
        header_len = b[0] | (b[1] << 8);
    } else {
        unsigned char b[4];
        if (!in.read(reinterpret_cast<char*>(b), 4)) throw Error(path + ": truncated .npy header");
        header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
    }
    if (header_len > (1u << 20)) throw Error(path + ": .npy header too large");
    std::string header(header_len, '\0');
    if (!in.read(header.data(), header_len)) throw Error(path + ": truncated .npy header");

    NpyArray a;
    std::string descr = field_value(header, "descr");
    if (descr.size() < 2) throw Error(path + ": .npy header has no dtype");
    a.dtype = descr.substr(1, descr.size() - 2);
    if (a.item_size() == 0) throw Error(path + ": unsupported .npy dtype " + a.dtype);
    if (field_value(header, "fortran_order").rfind("True", 0) == 0)
        throw Error(path + ": Fortran-order .npy not supported");
    std::string shape = field_value(header, "shape");
    if (shape.empty()) throw Error(path + ": .npy header has no shape");
    std::stringstream ss(shape.substr(1, shape.size() - 2));
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.find_first_not_of(' ') == std::string::npos) continue;
        a.shape.push_back(std::stoll(item));
    }
    size_t bytes = static_cast<size_t>(a.numel()) * a.item_size();
    a.data.resize(bytes);
    if (!in.read(a.data.data(), static_cast<std::streamsize>(bytes))) throw Error(path + ": truncated .npy data");
    return a;
}

void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
               size_t bytes) {
    std::string dims;
    for (size_t i = 0; i < shape.size(); ++i)
        dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    std::string header = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    // Pad so that magic + length + header is a multiple of 64, ending in '\n'.
    size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    std::string out = "\x93NUMPY";
    out += char(1);
    out += char(0);
    out += char(header.size() & 0xff);
    out += char((header.size() >> 8) & 0xff);
    out += header;
    out.append(static_cast<const char*>(data), bytes);
    if (!write_file_new(path, out.data(), out.size()))
        throw Error(path + " already exists; it is not replaced (choose another name)");
}

}  // namespace sd
