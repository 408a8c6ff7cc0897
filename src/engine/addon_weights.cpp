#include "engine/addon_weights.h"

#include <cmath>

#include "sd/error.h"

namespace sd {

NamedTensors read_addon_weights(const std::string& path, const std::string& what, uint64_t max_bytes,
                                const std::function<bool(const std::string&)>& wanted) {
    TensorReadOptions options;
    options.what = what;
    options.max_bytes = max_bytes;
    TensorReader file(path, options);
    NamedTensors out = read_tensors(file, [&](const TensorEntry& e) { return wanted(e.name); });
    for (auto& [name, t] : out)
        if (t.is_floating_point()) t = t.to(at::kFloat);
    return out;
}

std::string float_dtype_problem(const at::Tensor& t) {
    if (t.is_floating_point()) return "";
    const at::ScalarType s = t.scalar_type();
    const char* name = s == at::kLong    ? "I64"
                       : s == at::kInt   ? "I32"
                       : s == at::kShort ? "I16"
                       : s == at::kChar  ? "I8"
                       : s == at::kByte  ? "U8"
                       : s == at::kBool  ? "BOOL"
                                         : c10::toString(s);
    return std::string("has dtype ") + name + ", expected a float type";
}

std::string non_finite_problem(const at::Tensor& t) {
    if (!t.is_floating_point()) return "";
    // NaN and infinities carry through a sum: one pass without a temporary; only a sum that
    // is not finite (large finite values can make one too) is looked at value by value.
    const at::ScalarType acc = t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    if (std::isfinite(t.sum(acc).item<double>()) || at::isfinite(t).all().item<bool>()) return "";
    return "holds NaN or infinite values";
}

}  // namespace sd
