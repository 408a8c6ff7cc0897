#include "fuzz_targets.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "image/mask.h"
#include "image/resize.h"
#include "io/image_io.h"
#include "io/image_reader.h"
#include "io/lora_keys.h"
#include "io/png_text.h"
#include "io/torch_pickle.h"
#include "io/weight_file.h"
#include "sd/error.h"
#include "sd/loras.h"
#include "sd/model_config.h"
#include "sd/prompts.h"
#include "sd/tokenizer.h"
#include "sd/value_rules.h"
#include "text/html_unescape.h"
#include "text/prompt_schedule.h"
#include "text/prompt_weights.h"
#include "text/text_clean.h"

namespace sdfuzz {

namespace {

void require(bool ok, const std::string& what) {
    if (!ok) throw Finding(what);
}

std::string text_of(const uint8_t* data, size_t size) {
    return std::string(reinterpret_cast<const char*>(data), size);
}

// Code points that UTF-8 can carry (what u32_to_utf8 must be able to write).
bool valid_code_points(const std::u32string& s) {
    for (char32_t c : s)
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
    return true;
}

}  // namespace

void weight_index(const uint8_t* data, size_t size) {
    const std::string bytes = text_of(data, size);
    std::vector<sd::WeightEntry> index;
    try {
        index = sd::parse_weight_index(bytes, "fuzz.weights");
    } catch (const sd::Error&) {
        return;
    }
    // Every accepted range lies after the header, inside the file, and holds
    // exactly its shape's elements, aligned: model loading maps it as is.
    uint64_t header_end = 8;
    for (int i = 7; i >= 0; --i) header_end += static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    std::map<std::string, const sd::WeightEntry*> by_name;
    for (const auto& w : index) by_name[w.name] = &w;
    for (const auto& w : index) {
        const uint64_t elem =
            w.dtype == "F32" ? 4 : (w.dtype == "F16" || w.dtype == "BF16") ? 2 : w.dtype == "I8" ? 1 : 0;
        require(elem != 0, "accepted dtype " + w.dtype);
        // An 8-bit weight goes with its F16 scales, one per 32 values of each row (and back).
        if (w.dtype == "I8") {
            const auto it = by_name.find(w.name + "_scale");
            require(it != by_name.end() && it->second->dtype == "F16" && w.shape.size() >= 2 &&
                        it->second->shape.size() == 2 && it->second->shape[0] == w.shape[0] && w.shape[0] > 0,
                    "I8 without its scales: " + w.name);
            int64_t row = 1;
            for (size_t i = 1; i < w.shape.size(); ++i) row *= w.shape[i];
            require(row > 0 && row % 32 == 0 && it->second->shape[1] == row / 32, "scales of another shape: " + w.name);
        }
        if (w.name.size() > 13 && w.name.compare(w.name.size() - 13, 13, ".weight_scale") == 0) {
            const auto it = by_name.find(w.name.substr(0, w.name.size() - 6));
            require(it != by_name.end() && it->second->dtype == "I8", "scales without an I8 weight: " + w.name);
        }
        require(w.begin >= header_end && w.begin <= w.end && w.end <= size, "range outside the data: " + w.name);
        require(w.begin % elem == 0, "unaligned: " + w.name);
        require(w.shape.size() <= 8, "more than 8 sizes: " + w.name);
        uint64_t count = 1;
        for (int64_t n : w.shape) {
            require(n >= 0, "negative size: " + w.name);
            count *= static_cast<uint64_t>(n);  // cannot wrap: the parser bounds it by the file's size
        }
        require(w.end - w.begin == count * elem, "range does not match the shape: " + w.name);
    }
}

void model_config(const uint8_t* data, size_t size) {
    sd::ModelConfig c;
    try {
        c = sd::parse_model_config(text_of(data, size), "fuzz-model");
    } catch (const sd::Error&) {
        return;
    }
    // What the rest of the program sizes things from.
    require(c.context_length >= 2 && c.context_length <= 1024, "context_length");
    require(c.latent_channels >= 1 && c.latent_channels <= 64, "latent_channels");
    require(c.downsample_factor >= 1 && c.downsample_factor <= 64, "downsample_factor");
    require(c.size_multiple >= 1 && c.image_size % c.size_multiple == 0, "image_size / size_multiple");
    require(std::isfinite(c.scale_factor) && c.scale_factor > 0, "scale_factor");
    require(c.alphas_cumprod.size() >= 2 && c.alphas_cumprod.size() <= 100000, "alphas_cumprod size");
    for (float a : c.alphas_cumprod) require(a > 0 && a <= 1, "alphas_cumprod entry outside (0, 1]");
    for (const auto* p : {&c.text_encoder_path, &c.unet_path, &c.vae_decoder_path, &c.vocab_path, &c.merges_path})
        require(p->rfind("fuzz-model/", 0) == 0 && p->find('/', 11) == std::string::npos, "file outside the folder: " + *p);
}

void prompts(const uint8_t* data, size_t size) {
    if (size == 0) return;
    const bool jsonl = data[0] & 1;
    std::vector<sd::PromptLine> lines;
    try {
        lines = sd::parse_prompts(text_of(data + 1, size - 1), jsonl ? "fuzz.jsonl" : "fuzz.txt", jsonl);
    } catch (const sd::Error&) {
        return;
    }
    require(!lines.empty(), "no prompts and no error");
    int last = 0;
    for (const auto& p : lines) {
        require(p.line > last, "line numbers out of order");
        last = p.line;
        require(sd::is_valid_utf8(p.prompt) && p.prompt.find('\0') == std::string::npos &&
                    p.prompt.size() <= sd::kMaxPromptBytes,
                "a prompt that check_prompt_text refuses");
        const auto& o = p.overrides;
        if (o.negative_prompt) require(sd::is_valid_utf8(*o.negative_prompt), "negative prompt not UTF-8");
        if (o.steps) require(*o.steps >= sd::kStepsRange.lo && *o.steps <= sd::kStepsRange.hi, "steps");
        if (o.height) require(*o.height >= sd::kSideRange.lo && *o.height <= sd::kSideRange.hi, "H");
        if (o.width) require(*o.width >= sd::kSideRange.lo && *o.width <= sd::kSideRange.hi, "W");
        if (o.n_iter) require(*o.n_iter >= sd::kIterRange.lo && *o.n_iter <= sd::kIterRange.hi, "n_iter");
        if (o.scale) require(std::isfinite(*o.scale) && *o.scale >= sd::kMinScale && *o.scale <= sd::kMaxScale, "scale");
        if (o.sampler) require(!o.sampler->empty(), "empty sampler");
    }
}

void prompt_weights(const uint8_t* data, size_t size) {
    const std::string prompt = text_of(data, size);
    const auto runs = sd::parse_prompt_weights(prompt);  // documented never to throw
    require(!runs.empty(), "no runs");
    size_t chars = 0;
    for (const auto& r : runs) {
        require(!r.is_break || r.text.empty(), "BREAK with text");
        chars += r.text.size();
    }
    // Syntax is removed, never added.
    require(chars <= prompt.size(), "more text out than in");
    // Extra-network tags: removed whole, each a "<...>" span of the prompt; LoRA tags parse or are refused.
    require(sd::strip_network_tags(prompt).size() <= prompt.size(), "tags add text");
    for (const auto& tag : sd::unapplied_network_tags(prompt))
        require(tag.size() >= 4 && tag.front() == '<' && tag.back() == '>' && prompt.find(tag) != std::string::npos,
                "a tag that is not a span of the prompt");
    // A1111's composed parts: pieces of the prompt between ANDs, no more text than it has.
    size_t part_chars = 0;
    const auto parts = sd::composed_parts(prompt);
    require(!parts.empty(), "no composed parts");
    for (const auto& part : parts) {
        require(prompt.find(part.text) != std::string::npos, "a composed part that is not a span of the prompt");
        require(!std::isnan(part.weight), "a NaN part weight");
        part_chars += part.text.size();
    }
    require(part_chars <= prompt.size(), "composed parts longer than their prompt");
    // A1111's prompt editing and alternation: steps in order up to the last, each text at most
    // the prompt (brackets and WHEN removed, never text added); no '[': the prompt unchanged.
    for (const auto& [steps, first] : {std::pair{1, 0}, std::pair{7, 0}, std::pair{40, 0}, std::pair{12, 20}}) {
        const auto schedule = sd::prompt_schedule(prompt, steps, first);
        require(!schedule.empty() && schedule.back().until == steps, "a schedule that does not end at its steps");
        for (size_t i = 0; i < schedule.size(); ++i) {
            require(schedule[i].until >= 1 && (i == 0 || schedule[i - 1].until < schedule[i].until),
                    "schedule steps out of order");
            require(schedule[i].text.size() <= prompt.size(), "a scheduled text longer than its prompt");
        }
        if (prompt.find('[') == std::string::npos)
            require(schedule.size() == 1 && schedule[0].text == prompt, "a prompt without brackets changed");
    }
    try {
        for (const auto& t : sd::find_lora_tags(prompt, "fuzz"))
            require(!t.name.empty() && std::isfinite(t.text_weight) && std::isfinite(t.unet_weight), "bad LoRA tag");
    } catch (const sd::Error&) {
    }
}

void tokenizer(const uint8_t* data, size_t size) {
    // Loaded once: models/clip is the vocabulary the tool ships with.
    static const sd::ClipTokenizer tok = [] {
        const char* dir = std::getenv("SD_CLIP_MODEL_DIR");
        const std::string d = dir ? dir : SD_CLIP_MODEL_DIR;
        return sd::ClipTokenizer::load(d + "/vocab.json", d + "/merges.txt");
    }();
    const std::string text = text_of(data, size);
    // The clean-up steps on their own, open_clip's html.unescape included.
    const std::u32string cleaned = sd::clean_prompt(text);
    require(valid_code_points(cleaned), "clean_prompt made an invalid code point");
    require(sd::is_valid_utf8(sd::u32_to_utf8(cleaned)), "cleaned text is not UTF-8");
    const std::u32string unescaped = sd::html_unescape(sd::html_unescape(sd::fix_text(sd::utf8_to_u32(text))));
    require(valid_code_points(unescaped), "html_unescape made an invalid code point");
    // The tokenizer as the tool calls it: plain, padded, and in weighted chunks.
    for (int id : tok.encode(text)) require(id >= 0, "negative token id");
    const auto padded = tok.encode_padded(text);
    require(padded.size() == 77 && padded.front() == 49406, "encode_padded shape");
    const auto chunks = sd::tokenize_prompt(tok, text, sd::PromptSyntax{}, 77, 49406, 49407, 49407);
    require(!chunks.ids.empty() && chunks.ids.size() == chunks.weights.size(), "chunk count");
    for (size_t k = 0; k < chunks.ids.size(); ++k)
        require(chunks.ids[k].size() == 77 && chunks.weights[k].size() == 77 && chunks.ids[k][0] == 49406,
                "chunk shape");
}

void png_text(const uint8_t* data, size_t size) {
    if (size == 0) return;
    const std::vector<uint8_t> rest(data + 1, data + size);
    if (data[0] & 1) {
        // keyword NUL text, added to a valid PNG: reads back exactly, or is refused
        // because the keyword or the text breaks the documented rules.
        static const std::vector<uint8_t> base = [] {
            sd::Image img;
            img.width = 2;
            img.height = 2;
            img.rgb.assign(12, 7);
            return sd::encode_png(img);
        }();
        const std::string s(rest.begin(), rest.end());
        const size_t nul = s.find('\0');
        const std::string keyword = s.substr(0, nul);
        const std::string text = nul == std::string::npos ? "" : s.substr(nul + 1);
        std::vector<uint8_t> with;
        try {
            with = sd::png_add_itxt(base, keyword, text);
        } catch (const sd::Error&) {
            require(keyword.empty() || keyword.size() > 79 || text.find('\0') != std::string::npos || !sd::is_valid_utf8(text),
                    "a valid keyword and text refused");
            return;
        }
        const auto texts = sd::png_read_text(with);  // must not throw: we just wrote it
        require(texts.size() == 1 && texts.count(keyword) && texts.at(keyword) == text, "round trip");
        return;
    }
    // Fuzzed bytes as a PNG: read its texts; if a chunk can be added, the
    // result still reads, with the new text and every old one.
    std::map<std::string, std::string> before;
    try {
        before = sd::png_read_text(rest);
    } catch (const sd::Error&) {
    }
    std::vector<uint8_t> with;
    try {
        with = sd::png_add_itxt(rest, "fuzz", "text \xC3\xA9");
    } catch (const sd::Error&) {
        return;
    }
    std::map<std::string, std::string> after;
    try {
        after = sd::png_read_text(with);
    } catch (const sd::Error& e) {
        // Adding a chunk checks the same structure that reading does, so an
        // accepted PNG reads back; only a text chunk (malformed, not UTF-8, too long) may still fail.
        const std::string why = e.what();
        require(why.find("malformed") != std::string::npos || why.find("not valid UTF-8") != std::string::npos ||
                    why.find("text chunk") != std::string::npos,
                std::string("a PNG that png_add_itxt accepted does not read: ") + e.what());
        return;
    }
    if (!before.count("fuzz")) require(after.count("fuzz") && after.at("fuzz") == "text \xC3\xA9", "added text lost");
    for (const auto& [k, v] : before)
        if (k != "fuzz") require(after.count(k) && after.at(k) == v, "old text lost: " + k);
}

void torch_pickle(const uint8_t* data, size_t size) {
    std::vector<sd::PickledTensor> tensors;
    try {
        tensors = sd::parse_torch_pickle(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.pkl");
    } catch (const sd::Error&) {
        return;
    }
    // Every accepted tensor lies inside its storage as the pickle sized it:
    // tensor_file.cpp reads the bytes on that promise.
    for (const auto& t : tensors) {
        require(sd::dtype_size(t.dtype) > 0, "accepted dtype " + t.dtype);
        require(t.shape.size() == t.stride.size() && t.shape.size() <= 16, "sizes and strides: " + t.name);
        require(t.offset >= 0 && t.storage_numel >= 0, "negative offset or storage: " + t.name);
        bool empty = false;
        long double last = static_cast<long double>(t.offset);
        for (size_t d = 0; d < t.shape.size(); ++d) {
            require(t.shape[d] >= 0 && t.stride[d] >= 0, "negative size or stride: " + t.name);
            empty = empty || t.shape[d] == 0;
            if (t.shape[d] > 0) last += static_cast<long double>(t.shape[d] - 1) * static_cast<long double>(t.stride[d]);
        }
        require(empty || last < static_cast<long double>(t.storage_numel), "outside its storage: " + t.name);
        for (char c : t.storage) require(std::isalnum(static_cast<unsigned char>(c)) || c == '_', "storage name");
    }
}

void lora_file(const uint8_t* data, size_t size) {
    // A UNet with a 1x1-conv proj_in, a linear to_q and a 3x3 conv; a text encoder's q_proj.
    static const sd::LoraTargets targets = [] {
        sd::LoraTargets t;
        auto entry = [](const char* name, std::vector<int64_t> shape) {
            sd::WeightEntry w;
            w.name = name;
            w.dtype = "F32";
            w.shape = std::move(shape);
            return w;
        };
        t.unet = {entry("input_blocks.1.1.proj_in.weight", {8, 8, 1, 1}),
                  entry("input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight", {8, 8}),
                  entry("input_blocks.1.0.in_layers.2.weight", {8, 4, 3, 3})};
        t.text_encoder = {entry("text_model.encoder.layers.0.self_attn.q_proj.weight", {8, 8})};
        return t;
    }();
    const std::string bytes = text_of(data, size);
    sd::LoraFile file;
    try {
        file = sd::parse_lora(bytes, "fuzz.safetensors", targets);
    } catch (const sd::Error&) {
        return;
    }
    // What merging relies on: each module's tensors lie in the file, are matrices or
    // more, and the change its kind rebuilds has its target's number of values.
    for (const auto& m : file.modules) {
        const auto shape = [&](const char* part) { return m.part(part).shape; };
        for (const auto& [part, w] : m.parts) {
            require(w.end <= size, "range outside the file: " + m.key + " " + part);
            require(w.shape.size() >= 2, "not a matrix: " + m.key + " " + part);
        }
        require(std::isfinite(m.alpha) && std::isfinite(m.scale()), "alpha not finite: " + m.key);
        const auto numel = [](const std::vector<int64_t>& s, size_t from = 0) {
            long double n = 1;
            for (size_t i = from; i < s.size(); ++i) n *= s[i];
            return n;
        };
        // A factor: a @ b.flatten(1), or with t the CP product [a[1], b[1], t[2], t[3]].
        const auto factor = [&](const char* a, const char* b, const char* t) {
            if (m.has(t)) return static_cast<long double>(shape(a)[1]) * shape(b)[1] * shape(t)[2] * shape(t)[3];
            return static_cast<long double>(shape(a)[0]) * numel(shape(b), 1);
        };
        long double got = 0;
        if (m.kind == sd::LoraKind::lora) {
            require(m.rank > 0 && shape("down")[0] == m.rank && shape("up")[1] == m.rank, "rank mismatch: " + m.key);
            got = shape("up")[0] * numel(shape("down"), 1);
            if (m.has("mid")) got = static_cast<long double>(shape("up")[0]) * shape("down")[1] * shape("mid")[2] * shape("mid")[3];
        } else if (m.kind == sd::LoraKind::loha) {
            require(m.rank == shape("hada_w1_b")[0], "rank mismatch: " + m.key);
            got = factor("hada_w1_a", "hada_w1_b", "hada_t1");
            require(got == factor("hada_w2_a", "hada_w2_b", "hada_t2"), "LoHa factors differ in size: " + m.key);
        } else {
            const long double w1 = m.has("lokr_w1") ? numel(shape("lokr_w1")) : factor("lokr_w1_a", "lokr_w1_b", "");
            const long double w2 = m.has("lokr_w2") ? numel(shape("lokr_w2")) : factor("lokr_w2_a", "lokr_w2_b", "lokr_t2");
            got = w1 * w2;
        }
        const auto& all = m.stage == "unet" ? targets.unet : targets.text_encoder;
        bool found = false;
        for (const auto& w : all) {
            if (w.name != m.param) continue;
            found = true;
            require(numel(w.shape) == got, "the change does not fill its target: " + m.key);
            // A DoRA magnitude: one value per output row or per input column, with W's dims.
            if (m.has("dora_scale")) {
                const auto& d = shape("dora_scale");
                require(d.size() == w.shape.size() && sd::dora_axis(d, w.shape) >= 0 &&
                            numel(d) == w.shape[sd::dora_axis(d, w.shape)],
                        "a DoRA magnitude of another shape: " + m.key);
            }
        }
        require(found, "target not in the model: " + m.param);
    }
}

void image_reader(const uint8_t* data, size_t size) {
    if (size == 0) return;
    const bool mask = data[0] & 1;
    const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
    // Small limits, so that a header's size cannot take the fuzzer's memory.
    sd::PictureLimits limits;
    limits.max_side = 1024;
    limits.max_pixels = 1 << 18;
    const int orientation = sd::exif_orientation(bytes);
    require(orientation >= 0 && orientation <= 8, "EXIF orientation out of range");
    sd::Image img;
    sd::GreyImage grey;
    try {
        if (mask) grey = sd::decode_mask(bytes, "fuzz", limits);
        else img = sd::decode_image(bytes, "fuzz", limits);
    } catch (const sd::Error&) {
        return;
    }
    const int w = mask ? grey.width : img.width, h = mask ? grey.height : img.height;
    require(w >= 1 && h >= 1 && w <= limits.max_side && h <= limits.max_side && int64_t(w) * h <= limits.max_pixels,
            "accepted size outside the limits");
    require((mask ? grey.v.size() : img.rgb.size()) == size_t(w) * h * (mask ? 1 : 3), "pixel count");
    // The accepted picture through the geometry: every mode gives the size asked for.
    for (auto mode : {sd::ResizeMode::Just, sd::ResizeMode::Crop, sd::ResizeMode::Fill}) {
        if (mask) require(sd::fit_grey(grey, 24, 16, mode).v.size() == 24u * 16u, "fit_grey size");
        else require(sd::fit_image(img, 16, 24, mode).rgb.size() == 16u * 24u * 3u, "fit_image size");
    }
    if (mask) require(sd::blur_mask(grey, 2).v.size() == grey.v.size(), "blur size");
}

const std::vector<Named>& all_targets() {
    static const std::vector<Named> targets = {
        {"weight_index", weight_index}, {"model_config", model_config}, {"prompts", prompts},
        {"prompt_weights", prompt_weights}, {"tokenizer", tokenizer},     {"png_text", png_text},
        {"torch_pickle", torch_pickle}, {"lora_file", lora_file},       {"image_reader", image_reader},
    };
    return targets;
}

}  // namespace sdfuzz
