#include "engine/embeddings.h"

#include <algorithm>
#include <filesystem>

#include "engine/tensor_file.h"
#include "io/embedding_file.h"
#include "io/fs_util.h"
#include "io/printable.h"
#include "sd/error.h"

namespace sd {
namespace {

// Embeddings are kilobytes (an SDXL pair under a megabyte); a file this large is a
// model or a LoRA given by mistake, and reading all its tensors would take its size in memory.
constexpr uintmax_t kMaxEmbeddingBytes = 64u << 20;

struct Vectors {
    std::string name, hash;  // the tensor's name, A1111's short hash of the file
    at::Tensor tensor;
    at::Tensor tensor_2;  // SDXL: clip_g (tensor is clip_l)
};

// The tensor of an embedding file that holds its vectors, its name
// (embedding_file.h) and the file's hash, from one open of the file; SDXL
// (sdxl true): the clip_l and clip_g pair.
Vectors read_vectors(const std::string& path, bool sdxl) {
    const size_t size = check_regular_file(path, "embedding");
    if (size > kMaxEmbeddingBytes)
        throw Error("embedding " + path + " is " + std::to_string(size >> 20) +
                    " MiB: far larger than a textual-inversion embedding (a model or a LoRA?)");
    TensorReadOptions options;
    options.what = "embedding";
    options.max_bytes = kMaxEmbeddingBytes;
    options.hash = true;
    try {
        TensorReader file(path, options);
        std::vector<std::string> names;
        for (const auto& t : file.tensors()) names.push_back(t.name);
        const std::vector<std::string> wanted = sdxl ? sdxl_embedding_tensor_names(names, path)
                                                     : std::vector<std::string>{embedding_tensor_name(names, path)};
        NamedTensors read = read_tensors(file, [&](const TensorEntry& e) {
            return std::find(wanted.begin(), wanted.end(), e.name) != wanted.end();
        });
        Vectors v;
        v.name = wanted[0];
        for (auto& [name, tensor] : read) {
            if (!tensor.is_floating_point())
                throw Error("embedding " + path + ": " + printable(name) + " is not a float tensor");
            (name == wanted[0] ? v.tensor : v.tensor_2) = tensor.to(at::kFloat);
        }
        v.hash = file.sha256().substr(0, 10);  // A1111's short hash, as embedding_short_hash
        return v;
    } catch (const Error& e) {
        const std::string m = e.what();
        if (m.rfind("embedding ", 0) == 0) throw;
        throw Error("textual-inversion embedding: " + m);  // the message names the file
    }
}

// Vectors [n, D] from a stored tensor [D] (diffusers) or [n, D], checked.
at::Tensor as_vectors(const at::Tensor& t, const std::string& path, const std::string& name, int width,
                      int max_vectors) {
    const at::Tensor v = t.dim() == 1 ? t.unsqueeze(0) : t;
    if (v.dim() != 2)
        throw Error("embedding " + path + ": its tensor has " + std::to_string(t.dim()) +
                    " dimensions; an embedding is [vectors, width] or [width]");
    if (v.size(1) != width)
        throw Error("embedding " + path + " has vectors of width " + std::to_string(v.size(1)) +
                    ", but this model's text encoder has width " + std::to_string(width) +
                    " (an embedding made for another model family)");
    if (v.size(0) < 1 || v.size(0) > max_vectors)
        throw Error("embedding " + path + " has " + std::to_string(v.size(0)) + " vectors; between 1 and " +
                    std::to_string(max_vectors) + " fit in a prompt window");
    if (!at::isfinite(v).all().item<bool>())
        throw Error("embedding " + path + ": its tensor " + printable(name) + " holds NaN or infinite values");
    return v.contiguous();
}

}  // namespace

std::vector<Embedding> load_embeddings(const std::vector<std::string>& files, int width, int max_vectors, int width_2) {
    std::vector<Embedding> out;
    for (const auto& path : files) {
        if (!is_embedding_file_name(path))
            throw Error("embedding " + path + ": not an embedding file (.safetensors, .pt or .bin)");
        Vectors v = read_vectors(path, width_2 > 0);
        Embedding e;
        e.path = path;
        e.trigger = embedding_trigger(path, v.name);
        check_trigger_word(e.trigger, "embedding " + path);
        e.vectors = as_vectors(v.tensor, path, v.name, width, max_vectors);
        if (width_2 > 0) {
            e.vectors_2 = as_vectors(v.tensor_2, path, "clip_g", width_2, max_vectors);
            // Each position of the trigger takes one vector of each encoder.
            if (e.vectors_2.size(0) != e.vectors.size(0))
                throw Error("embedding " + path + " has " + std::to_string(e.vectors.size(0)) + " clip_l vectors but " +
                            std::to_string(e.vectors_2.size(0)) +
                            " clip_g vectors; an SDXL embedding has as many of each");
        }
        e.hash = v.hash;
        // Matching is exact-case, but two triggers that differ only in case
        // (Emb.pt, emb.pt) would leave the user guessing which one a prompt calls.
        for (const auto& other : out)
            if (same_ignoring_case(other.trigger, e.trigger))
                throw Error("embeddings " + other.path + " and " + path + " both have the trigger word \"" +
                            printable(e.trigger) + "\"" +
                            (other.trigger == e.trigger ? "" : " (differing only in case)"));
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<AddedWord> added_words(const std::vector<Embedding>& embeddings, int64_t first_id) {
    std::vector<AddedWord> out;
    for (const auto& e : embeddings) {
        out.push_back({e.trigger, first_id, static_cast<int>(e.vectors.size(0))});
        first_id += e.vectors.size(0);
    }
    return out;
}

at::Tensor embedding_table(const std::vector<Embedding>& embeddings, int width, bool second) {
    std::vector<at::Tensor> parts;
    for (const auto& e : embeddings) parts.push_back(second ? e.vectors_2 : e.vectors);
    return parts.empty() ? at::zeros({0, width}) : at::cat(parts);
}

at::Tensor token_table(const torch::jit::Module& text_encoder) {
    for (const auto& p : text_encoder.named_parameters())
        if (p.name == "text_model.embeddings.token_embedding.weight") return p.value;
    throw Error("the text encoder has no token embedding table (text_model.embeddings.token_embedding.weight)");
}

void check_text_encoder_features(const torch::jit::Module& text_encoder, const std::string& path, bool clip_skip,
                                 bool embeddings) {
    if ((clip_skip || embeddings) && !text_encoder.hasattr("clip_skip"))
        throw Error(path + " was exported before " + (clip_skip ? "--clip-skip" : "textual-inversion embeddings") +
                    " existed: re-export the model with this version (scripts/export_model.py)");
}

namespace {

// The token embeddings of ids [m, L]: the table's rows, and extra's for ids past it.
at::Tensor token_embeddings(const at::Tensor& table, const at::Tensor& ids, const at::Tensor& extra) {
    const int64_t vocab = table.size(0);
    const at::Tensor added = ids >= vocab;
    at::Tensor x = at::embedding(table, ids.clamp_max(vocab - 1));
    x.index_put_({added}, extra.to(table.scalar_type()).index_select(0, ids.masked_select(added) - vocab));
    return x;
}

}  // namespace

at::Tensor encode_ids(torch::jit::Module& text_encoder, const at::Tensor& ids, int64_t skip, const at::Tensor& extra) {
    if (text_encoder.hasattr("clip_skip")) text_encoder.setattr("clip_skip", skip);
    const at::Tensor table = token_table(text_encoder);
    if (extra.size(0) == 0 || !(ids >= table.size(0)).any().item<bool>()) return text_encoder.forward({ids}).toTensor();
    return text_encoder.run_method("forward_embeds", token_embeddings(table, ids, extra)).toTensor();
}

std::pair<at::Tensor, at::Tensor> encode_ids_pooled(torch::jit::Module& text_encoder, const at::Tensor& ids,
                                                    int64_t skip, const at::Tensor& extra) {
    text_encoder.setattr("clip_skip", skip);
    const at::Tensor table = token_table(text_encoder);
    const bool added = extra.size(0) > 0 && (ids >= table.size(0)).any().item<bool>();
    c10::intrusive_ptr<c10::ivalue::Tuple> out;
    if (!added) {
        out = text_encoder.run_method("forward_pooled", ids).toTuple();
    } else {
        if (!text_encoder.find_method("forward_pooled_embeds"))
            throw Error(
                "the model's second text encoder was exported before SDXL textual-inversion embeddings "
                "existed: re-export the model with this version (scripts/export_model.py)");
        out = text_encoder.run_method("forward_pooled_embeds", token_embeddings(table, ids, extra), ids).toTuple();
    }
    return {out->elements()[0].toTensor(), out->elements()[1].toTensor()};
}

}  // namespace sd
