#include "engine/tensor_file.h"

#include <map>
#include <new>

#include "sd/error.h"

namespace sd {

at::ScalarType scalar_type_of(const std::string& dtype) {
    static const std::map<std::string, at::ScalarType> types = {
        {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"F64", at::kDouble}, {"I64", at::kLong},
        {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},       {"U8", at::kByte},    {"BOOL", at::kBool}};
    return types.at(dtype);
}

NamedTensors read_tensors(TensorReader& file, const std::function<bool(const TensorEntry&)>& keep) {
    const auto& entries = file.tensors();
    std::vector<size_t> which;
    for (size_t k = 0; k < entries.size(); ++k)
        if (!keep || keep(entries[k])) which.push_back(k);
    std::map<size_t, at::Tensor> made;
    try {
        // The reader checks the memory they take before this allocates any of it.
        file.read(which, [&](size_t k) {
            at::Tensor t = at::empty(entries[k].shape, at::TensorOptions().dtype(scalar_type_of(entries[k].dtype)));
            made[k] = t;
            return static_cast<char*>(t.data_ptr());
        });
    } catch (const std::bad_alloc&) {
        throw Error("cannot read " + file.path() + ": out of memory while reading its tensors");
    } catch (const c10::Error&) {  // LibTorch's allocator reports a failed allocation so
        throw Error("cannot read " + file.path() + ": out of memory while reading its tensors");
    }
    NamedTensors out;
    for (size_t k : which) out.emplace_back(entries[k].name, std::move(made[k]));
    return out;
}

NamedTensors read_tensor_file(const std::string& path, const TensorReadOptions& options) {
    TensorReader file(path, options);
    return read_tensors(file);
}

}  // namespace sd
