#include "model.h"

#include "error.h"
#include "fs_util.h"

namespace sd {

AttentionSetting parse_attention(const std::string& text) {
    AttentionSetting a;
    if (text == "full") {
        a.mode = AttentionMode::Full;
    } else if (text == "per-head") {
        a.mode = AttentionMode::PerHead;
    } else if (text == "chunked" || text.rfind("chunked:", 0) == 0) {
        a.mode = AttentionMode::Chunked;
        if (text.size() > 8) {
            const std::string n = text.substr(8);
            if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1)
                throw Error("invalid attention chunk size '" + n + "' (a positive number of query rows)");
            a.chunk = std::stoi(n);
        }
    } else {
        throw Error("unknown attention strategy '" + text + "' (choose full, per-head, chunked or chunked:N)");
    }
    return a;
}

std::string short_message(const c10::Error& e) {
    std::string m = e.what_without_backtrace();
    auto nl = m.find('\n');
    return nl == std::string::npos ? m : m.substr(0, nl);
}

torch::jit::Module load_stage(const std::string& path, at::ScalarType weights, c10::Device device) {
    if (!file_exists(path)) throw Error("model file " + path + " is missing");
    try {
        auto m = torch::jit::load(path, torch::kCPU);
        m.eval();
        // Module::to replaces one tensor at a time, so converting costs at most
        // one extra tensor, not a second copy of the weights.
        for (const auto& p : m.parameters()) {
            if (p.is_floating_point() && p.scalar_type() != weights) {
                m.to(weights);
                break;
            }
        }
        if (!device.is_cpu()) m.to(device);
        return m;
    } catch (const c10::Error& e) {
        throw Error("cannot load model file " + path + ": not a valid TorchScript file (corrupt or truncated?)");
    } catch (const std::exception& e) {
        throw Error("cannot load model file " + path + ": " + e.what());
    }
}

void set_attention(torch::jit::Module& m, const AttentionSetting& a) {
    for (auto sub : m.modules()) {
        if (sub.hasattr("attention_mode")) {
            sub.setattr("attention_mode", static_cast<int64_t>(a.mode));
            sub.setattr("attention_chunk", static_cast<int64_t>(a.chunk));
        }
    }
}

void set_layer_memory(torch::jit::Module& m, int ff_chunk, int64_t conv_split) {
    for (auto sub : m.modules()) {
        if (sub.hasattr("ff_chunk")) sub.setattr("ff_chunk", static_cast<int64_t>(ff_chunk));
        if (sub.hasattr("conv_split")) sub.setattr("conv_split", conv_split);
    }
}

}  // namespace sd
