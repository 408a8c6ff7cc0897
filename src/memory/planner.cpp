#include "memory/planner.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/weight_file.h"
#include "sd/error.h"

namespace sd {

// UNet activations = a fixed part + a part per latent pixel and row.
// Per pixel: the skip list plus kUnetTransientPerChannel x model_channels
// floats of block temporaries. Fixed: kUnetFixedPerLargestConv x the largest
// conv weight bytes of one call (oneDNN reorders each conv's weight into a
// temporary on every call). Fitted to whole runs at 512x512 with 1 and 16
// rows per pass, docs/memory.md.
static constexpr double kUnetTransientPerChannel = 8.0;
static constexpr double kUnetFixedPerLargestConv = 1.4;
// Prepacked convolutions copy their input into oneDNN's layout and their
// output back: floats per latent pixel and row, in units of model_channels,
// for the UNet; per output pixel in units of ch for the VAE. Fitted at 512x512
// with 1 row (full-size SD 1.5, --max-memory 3.5G: the UNet stage measured
// 35-50 MiB above the dense run, the VAE 130 MiB; docs/benchmarks.md, issue 21).
static constexpr double kUnetPrepackPerChannel = 10.0;
static constexpr double kVaePrepackFloatsPerChannel = 1.0;
// VAE decoder: floats per output pixel, in units of ch, at the finest level
// (upsampled 2ch input, its conv, ResnetBlock temporaries). See docs/memory.md.
// 8.1, not 8: the one run with no freed blocks kept (full-size SDXL, --weights
// q8, 1024x1024 under 4.5G) measured 8.06 x ch, 28 MiB over a plan of 8, and the
// VAE is that run's largest stage (docs/benchmarks.md, full-size SDXL at 1024²).
static constexpr double kVaeFloatsPerChannel = 8.1;
// Its mid-block attention runs on the latent grid at the widest channel count,
// beside the block's input, q, k and v; the finest level's activations are not
// yet allocated then. Counting them together over-predicted a 1024x1024
// per-head run by 22% (docs/benchmarks.md).
static constexpr double kVaeMidTensors = 4.0;
// TAESD: floats per output pixel, in units of its channel count, at the finest
// level: a Block's input, its conv output and the ReLU's copy alive together
// (no norms, no attention); measured at 512x512 in docs/memory.md.
static constexpr double kTaesdFloatsPerChannel = 3.0;
// Text encoder: activations are small next to its weights.
static constexpr double kTextActivationFloatsPerToken = 24.0;
// Freed-block reuse, per byte of a stage's predicted activations (and, in the
// UNet, of its attention scores): what its freed blocks reach when all are
// kept, and how much of that sits beside the stage's peak. Fitted to eight
// UNet and three VAE runs of the full-size model, docs/memory.md.
static constexpr double kUnetWorkingSet = 5.0, kUnetWorkingSetPerScore = 1.0;
static constexpr double kUnetShareAtPeak = 3.0, kUnetShareAtPeakPerScore = 0.1;
static constexpr double kVaeWorkingSet = 2.0, kVaeShareAtPeak = 1.1;
// Layer settings every plan uses (python/sd_export/modules/): the feed-forward runs
// over this many tokens at a time and a conv call takes at most this many
// weight bytes, which bounds the transient copies of the largest layers.
// The UNet levels whose 3x3 convolutions may run by Winograd: the first two. The
// third's (1280 channels at 1/4 the latent size) gain 1.5x for 2 GiB more weights.
static constexpr size_t kWinogradLevels = 2;
static constexpr int kFeedForwardChunk = 1024;
static constexpr double kConvSplitBytes = 32.0 * 1024 * 1024;

double conv_split_bytes() { return kConvSplitBytes; }

AttentionSetting parse_attention(const std::string& text) {
    AttentionSetting a;
    if (text == "full") {
        a.mode = AttentionMode::Full;
    } else if (text == "fused") {
        a.mode = AttentionMode::Fused;
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
        throw Error("unknown attention strategy '" + text + "' (choose fused, full, per-head, chunked or chunked:N)");
    }
    return a;
}

double parse_size(const std::string& text) {
    std::string t;
    for (char c : text)
        if (c != ' ') t += c;
    size_t pos = 0;
    double v = 0;
    try {
        v = std::stod(t, &pos);
    } catch (...) {
        throw Error("invalid memory size '" + text + "' (e.g. 4G, 3500M)");
    }
    std::string unit = t.substr(pos);
    for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    double mult = 1;
    if (unit.empty() || unit == "B")
        mult = 1;
    else if (unit == "K" || unit == "KB" || unit == "KIB")
        mult = 1024.0;
    else if (unit == "M" || unit == "MB" || unit == "MIB")
        mult = 1024.0 * 1024;
    else if (unit == "G" || unit == "GB" || unit == "GIB")
        mult = 1024.0 * 1024 * 1024;
    else if (unit == "T" || unit == "TB" || unit == "TIB")
        mult = 1024.0 * 1024 * 1024 * 1024;
    else
        throw Error("invalid memory size '" + text + "' (e.g. 4G, 3500M)");
    if (!(v > 0) || !std::isfinite(v)) throw Error("invalid memory size '" + text + "' (must be positive)");
    return v * mult;
}

std::string format_size(double bytes) {
    char buf[32];
    if (bytes >= 1024.0 * 1024 * 1024)
        std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else
        std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / (1024.0 * 1024));
    return buf;
}

// A budget a user can type, rounded up: "3.6G" or "700M".
static std::string suggest_size(double bytes) {
    char buf[32];
    if (bytes >= 1024.0 * 1024 * 1024)
        std::snprintf(buf, sizeof buf, "%.1fG", std::ceil(bytes / (0.1 * 1024 * 1024 * 1024)) / 10);
    else
        std::snprintf(buf, sizeof buf, "%.0fM", std::ceil(bytes / (1024.0 * 1024)));
    return buf;
}

static double file_size(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 ? static_cast<double>(st.st_size) : 0.0;
}

// A stage's weights: its TorchScript file and, in current exports, the weight file beside it.
static double stage_size(const std::string& path) { return file_size(path) + file_size(weight_file_for(path)); }

void set_taesd_stage(MemoryModel& m, int channels, double weight_bytes) {
    m.taesd_channels = channels;
    m.vae_weights = weight_bytes;
}

// A TAESD's weights are read into memory in the compute dtype (a few MB), not
// mapped from a file; its activations are a few channels' worth at full size.
static void predict_taesd(const MemoryModel& m, double h, double w, MemoryPlan& p) {
    p.taesd = true;
    p.vae_tile = 0;
    p.vae = {};
    p.vae.weights = p.vae.load = m.vae_weights;
    p.vae.activations = h * w * m.downsample * m.downsample * 4.0 * kTaesdFloatsPerChannel * m.taesd_channels;
    p.vae.beside_scores = p.vae.activations;
    p.vae.working_set = kVaeWorkingSet * p.vae.activations;
    p.vae.share_at_peak = kVaeShareAtPeak * p.vae.activations;
}

MemoryModel memory_model(const ModelConfig& c) {
    MemoryModel m;
    // SDXL's two text encoders load and run in the same stage.
    m.text_weights = stage_size(c.text_encoder_path) + (c.is_sdxl() ? stage_size(c.text_encoder_2_path) : 0.0);
    m.unet_weights = stage_size(c.unet_path);
    m.vae_weights = stage_size(c.vae_decoder_path);
    if (!c.vae_encoder_path.empty()) m.vae_encoder_weights = stage_size(c.vae_encoder_path);
    m.half_file = c.dtype == "float16" || c.dtype == "bfloat16";
    m.q8_file = c.dtype == "q8_0";
    m.latent_channels = c.latent_channels;
    m.downsample = c.downsample_factor;
    m.fused_attention = c.fused_attention;
    if (c.architecture_json.empty()) return m;  // older export: SD 1.x defaults
    try {
        auto a = nlohmann::json::parse(c.architecture_json);
        const auto& u = a.at("unet");
        m.model_channels = u.at("model_channels").get<int>();
        auto mult = u.at("channel_mult").get<std::vector<int>>();
        auto attn = u.at("attention_resolutions").get<std::vector<int>>();
        const int res_blocks = u.at("num_res_blocks").get<int>();
        // Skip list: conv_in, then per level num_res_blocks outputs and a downsample.
        double skip = m.model_channels;
        int ch = m.model_channels;
        m.attn_level = -1;
        for (size_t level = 0; level < mult.size(); ++level) {
            const double area = 1.0 / std::pow(4.0, static_cast<double>(level));
            ch = mult[level] * m.model_channels;
            skip += res_blocks * ch * area;
            if (level + 1 < mult.size()) skip += ch * area / 4.0;
            const int ds = 1 << level;
            if (m.attn_level < 0 && std::find(attn.begin(), attn.end(), ds) != attn.end())
                m.attn_level = static_cast<int>(level);
        }
        m.unet_skip_floats = skip;
        // The first output block's conv: the deepest skip concatenated in, 3x3, fp32.
        const double deepest = static_cast<double>(mult.back()) * m.model_channels;
        m.unet_largest_conv_bytes = 2.0 * deepest * deepest * 9.0 * 4.0;
        // Each level's 3x3 convolutions with its width c out, in c² units: per down
        // ResBlock a conv1 (the first from the level before's width) and a conv2; per up
        // ResBlock a conv2 and a conv1 from h and a skip concatenated (h: the level
        // below's width first, then c; skips: c, and last the level before's width);
        // the up side's Upsample conv but on the first level.
        for (size_t level = 0; level < mult.size() && level < kWinogradLevels; ++level) {
            const double c = mult[level] * m.model_channels;
            const double before = level == 0 ? m.model_channels : mult[level - 1] * m.model_channels;
            const double below = level + 1 < mult.size() ? mult[level + 1] * m.model_channels : c;
            double units = before / c + (res_blocks - 1) + res_blocks;  // down
            units += (below + c) / c + 2.0 * (res_blocks - 1) + (c + before) / c + (res_blocks + 1);
            if (level > 0) units += 1;
            m.unet_level_channels.push_back(static_cast<int>(c));
            m.unet_winograd_bytes.push_back(units * c * c * 36.0 * 4.0);
        }
        const int heads = u.value("num_heads", 8), head_ch = u.value("num_head_channels", -1);
        const int attn_ch = m.model_channels * mult[static_cast<size_t>(std::max(0, m.attn_level))];
        m.attn_heads = head_ch > 0 ? attn_ch / head_ch : heads;
        m.attn_channels = attn_ch;
        const auto& v = a.at("vae");
        m.vae_ch = v.at("ch").get<int>();
        m.vae_mid_channels = m.vae_ch * v.at("ch_mult").get<std::vector<int>>().back();
        const auto& t = a.at("text");
        m.text_ctx = t.value("ctx", 77);
        m.text_width = t.value("width", 768);
        m.text_heads = t.value("heads", 12);
        if (a.contains("text_2")) {  // SDXL: the wider of the two encoders sets the activations
            const auto& t2 = a.at("text_2");
            m.text_width = std::max(m.text_width, t2.value("width", 0));
            m.text_heads = std::max(m.text_heads, t2.value("heads", 0));
        }
    } catch (const nlohmann::json::exception& e) {
        throw Error("model.json: unreadable architecture (" + std::string(e.what()) + ")");
    }
    return m;
}

// Attention score bytes of one pass: rows x (queries at once) x keys, twice
// (the scores and their softmax live together).
// Fused attention holds no scores beyond a 64 x 256 tile per thread; what it
// adds is its padded copy of k and v (and in the VAE, whose q, k, v are
// channel-first views, a token-major copy of each and the output).
static double fused_bytes(double rows, double n, double channels, double copies) {
    return copies * rows * n * channels * 4.0;
}

static double score_bytes(double rows, double n, AttentionMode mode, int chunk, int heads) {
    double queries = mode == AttentionMode::Full      ? heads * n
                     : mode == AttentionMode::PerHead ? n
                                                      : std::min<double>(chunk, n);
    return 2.0 * rows * queries * n * 4.0;
}

std::string MemoryPlan::attention_name() const {
    if (attention_mode == AttentionMode::Fused) return "fused";
    if (attention_mode == AttentionMode::Full) return "full";
    if (attention_mode == AttentionMode::PerHead) return "per-head";
    return "chunked:" + std::to_string(attention_chunk);
}

// The encoder loads beside the resident stages (the UNet and decoder are still
// loaded from the batch before) and is released after its encode.
double MemoryPlan::peak() const {
    const double with_encoder = encode ? (sequential ? enc.total(base) : resident_total() + enc.total(0)) : 0;
    if (sequential) return std::max({text.total(base), unet.total(base), vae.total(base), with_encoder});
    const double weights = text.weights + unet.weights + vae.weights;
    return std::max(base + weights + std::max({text.transient(), unet.transient(), vae.transient()}), with_encoder);
}

double MemoryPlan::resident_total() const { return base + text.weights + unet.weights + vae.weights; }

namespace {

constexpr double kQ8BytesPerValue = 34.0 / 32.0;  // GGUF q8_0: an fp16 scale and 32 int8 a block

// The last tenth of the budget is never given to the cache: it is the margin
// for the error of the plan without it (an fp16-weight run measured 5% over).
constexpr double kCacheMargin = 0.1;

// Freed-block reuse (block_cache.h): the cache gets what the budget leaves
// over after the plan without it and the margin, up to the largest stage's
// working set, so a tight budget runs as before and a loose one runs faster.
MemoryPlan with_block_cache(MemoryPlan p) {
    const double lean = p.peak();
    const double most = std::max({p.text.working_set, p.unet.working_set, p.vae.working_set, p.enc.working_set});
    p.block_cache = std::max(0.0, std::min(most, (1 - kCacheMargin) * p.budget - lean));
    for (StagePrediction* s : {&p.text, &p.unet, &p.vae, &p.enc}) {
        // The cache keeps a freed block only while it has room and never
        // evicts, so score blocks kept after the first attention hold their
        // share of the limit until the next attention takes them back: other
        // blocks get only what they leave (768x768, 4 images, per-head: 2.5
        // GiB blocks, 28% over-predicted without this).
        // Fused attention has no score blocks: its copies of k and v are ordinary
        // blocks, reused like the rest (full-size SDXL, 1024², fp16 under 7G: both
        // the UNet and the VAE kept the whole limit, 756 MiB; capping them at the
        // limit less two "score blocks" under-predicted the VAE by 140 MiB).
        const double block = p.attention_mode == AttentionMode::Fused ? 0.0 : s->scores / 2;
        const double held = block > 0 ? std::min(2.0, std::floor(p.block_cache / block)) * block : 0.0;
        s->kept = std::min(p.block_cache - held, s->share_at_peak);
    }
    return p;
}

}  // namespace

MemoryPlan predict(const MemoryModel& m, const MemoryRequest& r, double base, const MemoryPlan& choice) {
    MemoryPlan p = choice;
    p.base = base;
    p.budget = r.budget;
    p.budget_from_cgroup = r.budget_from_cgroup;
    const double h = r.height / m.downsample, w = r.width / m.downsample;
    const double rows = p.unet_rows;

    p.half_weights = r.half_weights;
    p.compute = std::string("fp32 on cpu, weights held in ") + (r.half_weights ? "fp16" : r.q8_weights ? "q8" : "fp32");
    p.ff_chunk = kFeedForwardChunk;
    p.conv_split = static_cast<int64_t>(kConvSplitBytes);
    // Weights as held: the text encoder in fp32 (bf16 in a bf16 run), the others as asked.
    // Loading converts the mapped file's tensors one at a time, each handing
    // its file pages back once converted (stage_loader.cpp): narrowing an fp32
    // file to fp16 holds the fp16 weights and one fp32 tensor at most
    // (measured: SD 1.5's UNet stage peaked at 1.95 GiB, not the file's 3.2).
    auto weights = [&](StagePrediction& s, double file, bool half) {
        s.weights = file * (half ? 2.0 : 4.0) / (m.half_file ? 2.0 : 4.0);
        const bool narrowing = half && !m.half_file;
        s.load = narrowing ? s.weights + std::min(file, m.unet_largest_conv_bytes) : std::max(file, s.weights);
    };

    // LoRA merging (lora_merge.h): each changed parameter is copied to fp32, its change
    // computed beside it, and the result converted at once to the type the stage holds,
    // taking its mapped original's place; so only the largest parameter's copy, change and
    // converted result add to the load. For 8-bit layers the fp32 copies wait until the
    // stage is narrowed: all of them add.
    const auto lora_load = [](const LoraFootprint& f, bool eight_bit, bool fp32) {
        return eight_bit ? f.total() : f.largest_param * (fp32 ? 1.0 : 1.5) + f.largest;
    };
    weights(p.text, m.text_weights, r.half_text);
    p.text.load += lora_load(r.text_lora, false, !r.half_text);
    p.text.activations = 2.0 * r.images * m.text_ctx * m.text_width * 4.0 * kTextActivationFloatsPerToken;
    p.text.scores = 2.0 * r.images * m.text_heads * m.text_ctx * m.text_ctx * 4.0;
    p.text.beside_scores = p.text.activations;

    weights(p.unet, m.unet_weights, r.half_weights);
    if (r.q8_weights && m.q8_file) {
        p.unet.weights = p.unet.load = m.unet_weights;  // the 8-bit file mapped as it is
    } else if (r.q8_weights) {
        // 34 bytes a block of 32 values; narrowing holds one layer in fp32 beside its file pages.
        p.unet.weights = m.unet_weights * kQ8BytesPerValue / (m.half_file ? 2.0 : 4.0);
        p.unet.load = p.unet.weights + 2.0 * std::min(m.unet_weights, m.unet_largest_conv_bytes);
    } else if (m.q8_file) {
        // Expanded at load, one layer at a time, to the type held.
        p.unet.weights = m.unet_weights / kQ8BytesPerValue * (r.half_weights ? 2.0 : 4.0);
        p.unet.load = p.unet.weights + std::min(p.unet.weights, m.unet_largest_conv_bytes);
    }
    p.unet.load += lora_load(r.unet_lora, r.q8_weights || m.q8_file, !r.half_weights);
    p.unet.weights += r.unet_scratch_bytes;
    const double hw = h * w;
    // fp16 weights add the fp32 copy of the layer that runs; 8-bit ones the int8 values
    // widened and the product (two fp32 copies of the layer).
    const double conv = std::min(m.unet_largest_conv_bytes, kConvSplitBytes);
    const double expansion = r.q8_weights ? 2.0 : r.half_weights ? 1.0 : 0.0;
    p.unet.activations = (kUnetFixedPerLargestConv + expansion) * conv +
                         rows * hw * 4.0 * (m.unet_skip_floats + kUnetTransientPerChannel * m.model_channels);
    if (m.attn_level >= 0) {
        const double n = hw / std::pow(4.0, m.attn_level);
        p.unet.scores = p.attention_mode == AttentionMode::Fused
                            ? fused_bytes(rows, n, m.attn_channels, 2.0)
                            : score_bytes(rows, n, p.attention_mode, p.attention_chunk, m.attn_heads);
    }
    // A q8 UNet expands its blocks per call and is never prepacked; the VAE still is.
    if (p.prepack && !r.q8_weights) p.unet.activations += rows * hw * 4.0 * kUnetPrepackPerChannel * m.model_channels;
    for (int level = 0; level < p.winograd_levels && level < static_cast<int>(m.unet_winograd_bytes.size()); ++level) {
        const double bytes = m.unet_winograd_bytes[static_cast<size_t>(level)] * r.winograd_added_floats / 36.0;
        p.unet.weights += bytes;
        p.unet.load += bytes;
    }
    p.unet.beside_scores = p.unet.activations;
    p.unet.working_set = kUnetWorkingSet * p.unet.activations + kUnetWorkingSetPerScore * p.unet.scores;
    p.unet.share_at_peak = kUnetShareAtPeak * p.unet.activations + kUnetShareAtPeakPerScore * p.unet.scores;

    // The VAE decodes one image at a time, whole or in overlapping tiles.
    // The encoder runs the same levels in the other direction (one VAELevel
    // per level, the mid-block attention on the latent grid) on the same
    // tiles: predicted as the decoder with its own weights. One measurement
    // backs that (full-size SD 1.5, 512²: 1.90 GiB of freed blocks kept in the
    // encode, the decoder's predicted working set 2.0 GiB; docs/benchmarks.md).
    const double th = p.vae_tile > 0 ? std::min<double>(h, p.vae_tile) : h;
    const double tw = p.vae_tile > 0 ? std::min<double>(w, p.vae_tile) : w;
    auto vae_stage = [&](StagePrediction& s, double file) {
        weights(s, file, r.half_weights);
        s.weights += r.vae_scratch_bytes;
        const double pixels = th * tw * m.downsample * m.downsample;
        s.activations =
            pixels * 4.0 * (kVaeFloatsPerChannel + (p.prepack ? kVaePrepackFloatsPerChannel : 0.0)) * m.vae_ch;
        s.scores = p.attention_mode == AttentionMode::Fused
                       ? fused_bytes(1, th * tw, m.vae_mid_channels, 6.0)
                       : score_bytes(1, th * tw, p.attention_mode, p.attention_chunk, 1);
        s.beside_scores = kVaeMidTensors * m.vae_mid_channels * th * tw * 4.0;
        s.working_set = kVaeWorkingSet * s.activations;
        s.share_at_peak = kVaeShareAtPeak * s.activations;
    };
    p.encode = r.encode && m.vae_encoder_weights > 0;
    if (p.encode) vae_stage(p.enc, m.vae_encoder_weights);
    if (m.taesd_channels > 0) {
        predict_taesd(m, h, w, p);
        return p;
    }
    vae_stage(p.vae, m.vae_weights);
    return p;
}

std::string MemoryPlan::describe() const {
    std::ostringstream o;
    auto row = [&](const char* name, const StagePrediction& s) {
        o << "  " << name << ": weights " << format_size(s.weights) << ", activations " << format_size(s.activations)
          << ", attention scores " << format_size(s.scores) << ", stage peak " << format_size(s.total(base)) << "\n";
    };
    o << "memory plan (budget " << format_size(budget) << (budget_from_cgroup ? ", the memory cgroup's limit" : "")
      << ", process base " << format_size(base) << ")\n";
    row("text encoder", text);
    row("unet        ", unet);
    row("vae decoder ", vae);
    if (encode) row("vae encoder ", enc);
    o << "  stage loading: " << (sequential ? "sequential (one stage in memory at a time)" : "all stages resident")
      << "\n";
    o << "  attention: " << attention_name() << ", UNet rows per pass: " << unet_rows << ", VAE: "
      << (taesd          ? std::string("TAESD, whole image")
          : vae_tile > 0 ? "tiles of " + std::to_string(vae_tile) + " latent px"
                         : std::string("whole image"))
      << "\n";
    o << "  compute: " << compute << (prepack ? ", convolutions prepacked" : "")
      << (winograd_levels > 0 ? ", 3x3 convolutions of " + std::to_string(winograd_levels) + " UNet level" +
                                    (winograd_levels > 1 ? "s" : "") + " by Winograd"
                              : std::string())
      << "\n";
    o << "  feed-forward in chunks of " << ff_chunk << " tokens, conv weights in slices of at most "
      << format_size(static_cast<double>(conv_split)) << "\n";
    o << "  freed blocks kept for reuse: up to " << format_size(block_cache) << " (UNet " << format_size(unet.kept)
      << ", VAE " << format_size(vae.kept) << ")\n";
    o << "  predicted peak: " << format_size(peak()) << "\n";
    return o.str();
}

MemoryPlan plan_memory(const MemoryModel& m, const MemoryRequest& r, double base) {
    const int full_rows = r.images * (r.guidance ? 2 : 1);
    std::vector<bool> seq_options = r.sequential ? std::vector<bool>{*r.sequential} : std::vector<bool>{false, true};
    std::vector<bool> prepack_options = r.prepack ? std::vector<bool>{*r.prepack} : std::vector<bool>{true, false};
    // Winograd weights: the most levels first (on: those, never fewer), then fewer.
    const int most = static_cast<int>(m.unet_winograd_bytes.size());
    std::vector<int> winograd_options;
    if (r.winograd_levels)
        winograd_options.push_back(std::min(*r.winograd_levels, most));
    else if (r.winograd.value_or(true))
        for (int levels = most; levels >= (r.winograd ? most : 0); --levels) winograd_options.push_back(levels);
    if (winograd_options.empty()) winograd_options.push_back(0);
    std::vector<int> rows_options;  // halving the UNet pass down to one row
    if (r.unet_rows)
        rows_options = {*r.unet_rows};
    else
        for (int rows = full_rows;; rows = rows > 2 ? 2 * ((rows + 3) / 4) : 1) {
            rows_options.push_back(rows);
            if (rows == 1) break;
        }
    // A TAESD is never tiled: the full VAE's tile sizes do not apply to it.
    std::vector<int> tile_options = m.taesd_channels > 0 ? std::vector<int>{0}
                                    : r.vae_tile         ? std::vector<int>{*r.vae_tile}
                                                         : std::vector<int>{0, 64, 32, 16};
    std::vector<AttentionSetting> attn_options;
    if (r.attention && r.attention->mode == AttentionMode::Fused && !m.fused_attention)
        throw Error(
            "--attention fused: this model folder was exported before the fused attention operator; "
            "export the checkpoint again with this build's scripts/export_model.py");
    if (r.attention)
        attn_options = {*r.attention};
    else
        attn_options = {{AttentionMode::Chunked, 256},
                        {AttentionMode::Chunked, 128},
                        {AttentionMode::Chunked, 64},
                        {AttentionMode::Chunked, 32},
                        {AttentionMode::Chunked, 16}};
    // Fused first where the modules have it: the fastest, and as small as chunked:320.
    if (!r.attention && m.fused_attention) attn_options.insert(attn_options.begin(), {AttentionMode::Fused, 0});

    // What to give up first as the budget shrinks: the Winograd weights (the
    // second level's, then the first's: a few percent of a step each), resident stages (a reload
    // costs seconds per batch), then prepacked convolutions (10-25% of a
    // step), then the size of UNet passes (results do not change), then the
    // attention chunk, and last whole-image VAE decoding (tiles change the
    // image slightly).
    MemoryPlan smallest;
    double smallest_peak = -1;
    for (int tile : tile_options)
        for (const AttentionSetting& attention : attn_options)
            for (int rows : rows_options)
                for (bool prepack : prepack_options)
                    for (bool seq : seq_options)
                        for (int winograd : winograd_options) {
                            if (winograd > 0 && !prepack) continue;  // Winograd weights are packed ones
                            MemoryPlan c;
                            c.sequential = seq;
                            c.prepack = prepack;
                            c.winograd_levels = winograd;
                            c.unet_rows = rows;
                            c.vae_tile = tile;
                            c.attention_mode = attention.mode;
                            c.attention_chunk = attention.chunk;
                            MemoryPlan p = predict(m, r, base, c);
                            if (p.peak() <= r.budget) return with_block_cache(p);
                            if (smallest_peak < 0 || p.peak() < smallest_peak) {
                                smallest_peak = p.peak();
                                smallest = p;
                            }
                        }
    throw Error(
        "not enough memory: the budget is " + format_size(r.budget) +
        (r.budget_from_cgroup ? " (what the process's memory cgroup allows)" : "") + " but the smallest plan (" +
        (smallest.sequential ? std::string("sequential loading, ") : std::string("resident stages, ")) +
        (smallest.prepack ? "prepacked convolutions, " : "") + smallest.attention_name() + " attention, " +
        std::to_string(smallest.unet_rows) + " UNet rows, " +
        (smallest.vae_tile ? "VAE tiles of " + std::to_string(smallest.vae_tile) : std::string("whole-image VAE")) +
        ") needs about " + format_size(smallest_peak) +
        (r.budget_from_cgroup ? "; give the job a memory limit of " : "; use --max-memory ") +
        suggest_size(smallest_peak) + " or more" + (r.half_weights ? "" : ", --weights fp16") + " or a smaller image");
}

}  // namespace sd
