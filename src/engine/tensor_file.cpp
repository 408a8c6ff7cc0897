#include "engine/tensor_file.h"

#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <caffe2/serialize/inline_container.h>

#include "io/fs_util.h"
#include "io/torch_pickle.h"
#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

namespace {

at::ScalarType scalar_type(const std::string& dtype) {
    static const std::map<std::string, at::ScalarType> types = {
        {"F32", at::kFloat}, {"F16", at::kHalf},   {"BF16", at::kBFloat16}, {"F64", at::kDouble},
        {"I64", at::kLong},  {"I32", at::kInt},    {"I16", at::kShort},     {"I8", at::kChar},
        {"U8", at::kByte},   {"BOOL", at::kBool}};
    return types.at(dtype);
}

std::string first_bytes(const std::string& path, size_t n) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("cannot read " + path + (file_exists(path) ? "" : ": no such file"));
    std::string b(n, '\0');
    f.read(b.data(), static_cast<std::streamsize>(n));
    b.resize(static_cast<size_t>(f.gcount()));
    return b;
}

std::vector<std::pair<std::string, at::Tensor>> read_safetensors(const std::string& path) {
    const auto index = read_weight_index(path, WeightUse::AnyDtype);  // every range checked against the file
    std::ifstream f(path, std::ios::binary);
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& w : index) {
        at::Tensor t = at::empty(w.shape, at::TensorOptions().dtype(scalar_type(w.dtype)));
        f.seekg(static_cast<std::streamoff>(w.begin));
        f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(w.end - w.begin));
        if (!f) throw Error("cannot read " + path + ": the file ends early");
        out.emplace_back(w.name, std::move(t));
    }
    return out;
}

// The archive's code records would make it a TorchScript module: loading that
// runs its code, so such a file is not a file of tensors.
void check_not_torchscript(caffe2::serialize::PyTorchStreamReader& reader, const std::string& path) {
    for (const auto& name : reader.getAllRecords())
        if (name.rfind("code/", 0) == 0 || name == "constants.pkl")
            throw Error(path + " is a TorchScript program, not a file of tensors; refusing to load it (README \"Security\")");
    if (reader.hasRecord("byteorder")) {
        auto [data, size] = reader.getRecord("byteorder");
        if (std::string(static_cast<const char*>(data.get()), size) != "little")
            throw Error("cannot read " + path + ": its tensors are stored big-endian");
    }
}

std::vector<std::pair<std::string, at::Tensor>> read_torch_zip(const std::string& path) {
    caffe2::serialize::PyTorchStreamReader reader(path);
    check_not_torchscript(reader, path);
    if (!reader.hasRecord("data.pkl")) throw Error("cannot read " + path + ": a zip archive without data.pkl (not a torch.save file)");
    auto [pkl, pkl_size] = reader.getRecord("data.pkl");
    const auto tensors = parse_torch_pickle(std::string_view(static_cast<const char*>(pkl.get()), pkl_size), path);

    std::map<std::string, at::Tensor> storages;  // each record read once, as bytes
    std::set<std::string> names;
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : tensors) {
        if (!names.insert(p.name).second) throw Error("cannot read " + path + ": two tensors named " + p.name);
        const int64_t elem = dtype_size(p.dtype);
        auto it = storages.find(p.storage);
        if (it == storages.end()) {
            const std::string record = "data/" + p.storage;
            if (!reader.hasRecord(record)) throw Error("cannot read " + path + ": the storage " + p.storage + " is missing");
            auto [data, size] = reader.getRecord(record);
            at::Tensor bytes = at::empty({static_cast<int64_t>(size)}, at::kByte);
            if (size) std::memcpy(bytes.data_ptr(), data.get(), size);
            it = storages.emplace(p.storage, bytes).first;
        }
        const at::Tensor& bytes = it->second;
        if (bytes.numel() < p.storage_numel * elem)
            throw Error("cannot read " + path + ": the storage " + p.storage + " is shorter than its tensors");
        // The pickle's sizes were checked against storage_numel (torch_pickle.cpp).
        at::Tensor typed = bytes.narrow(0, 0, p.storage_numel * elem).view(scalar_type(p.dtype));
        out.emplace_back(p.name, typed.as_strided(p.shape, p.stride, p.offset).clone(at::MemoryFormat::Contiguous));
    }
    return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> read_tensor_file(const std::string& path) {
    const std::string head = first_bytes(path, 4);
    if (head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x80 && head[1] <= 5)
        throw Error(path + " is in torch.save's format of before PyTorch 1.6, which this tool does not read; "
                           "save it again with a newer PyTorch or convert it to .safetensors");
    if (head.rfind("PK\x03\x04", 0) != 0) return read_safetensors(path);
    try {
        return read_torch_zip(path);
    } catch (const Error&) {
        throw;
    } catch (const std::exception&) {
        throw Error("cannot read " + path + ": not a valid zip archive of tensors (corrupt or truncated?)");
    }
}

}  // namespace sd
