// Hostile files through the tool (issue 32, points 1, 2, 4, 7 and the reader
// messages of 9): special files in place of LoRAs, embeddings, TAESD, --vae
// and a model's stage files; torch.save archives whose pickle or zip would
// take gigabytes; weights and tensors that are not finite numbers; trigger
// words a prompt could not type. Each is refused with exit 1 or 2 and one
// line naming the file, within 30 s, under 300 MB of peak RSS, with the
// output folder untouched (tests/common/bounded_run.h). The crafted files
// come from tests/cli/hostile_files.py.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "bounded_run.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

class Hostile : public ::testing::Test {
protected:
    void SetUp() override {
        out_ = sdtest::temp_dir();
        sdtest::write_text(out_ + "/00000.png", "an earlier image");  // must stay as it is
    }

    std::vector<std::string> args(std::vector<std::string> more) const {
        std::vector<std::string> v = {sdtest::cli(), "--model", sdtest::test_models() + "/tiny-st", "--outdir", out_,
                                      "--quiet", "--threads", "1", "--H", "64", "--W", "64", "--steps", "2",
                                      "--sampler", "ddim", "--seed", "1"};
        v.insert(v.end(), more.begin(), more.end());
        return v;
    }
    sdtest::BoundedResult refused(std::vector<std::string> more, const std::string& must_mention) const {
        return sdtest::expect_refused(args(std::move(more)), out_, must_mention);
    }
    // A file of hostile_files.py, made for this test in a folder of its own.
    static std::string crafted(const std::string& name) {
        const std::string dir = sdtest::temp_dir();
        const auto r = sdtest::run({sdtest::env("SD_PYTHON"), sdtest::env("SD_SOURCE_DIR") + "/tests/cli/hostile_files.py",
                                    dir, sdtest::fixtures(), name});
        EXPECT_EQ(r.exit_code, 0) << "hostile_files.py " << name << ":\n" << r.err;
        EXPECT_TRUE(fs::is_regular_file(dir + "/" + name)) << name << " was not made";  // else "does not exist" would pass
        return dir + "/" + name;
    }
    std::string out_;
};

std::string fifo_in(const std::string& dir, const std::string& name) {
    const std::string p = dir + "/" + name;
    EXPECT_EQ(mkfifo(p.c_str(), 0644), 0);
    return p;
}

std::string zero_link(const std::string& dir, const std::string& name) {
    const std::string p = dir + "/" + name;
    fs::create_symlink("/dev/zero", p);
    return p;
}

}  // namespace

// --- 1. special files: refused by check_regular_file, never opened ---

TEST_F(Hostile, LoraTagOnDevZeroLink) {
    const std::string d = sdtest::temp_dir();
    zero_link(d, "x.safetensors");
    const auto r = refused({"--prompt", "a cat <lora:x:1>", "--lora-dir", d}, "x.safetensors");
    EXPECT_NE(r.err.find("is a device"), std::string::npos) << r.err;
}

TEST_F(Hostile, LoraFlagOnDevZero) {
    const auto r = refused({"--prompt", "a cat", "--lora", "/dev/zero"}, "/dev/zero");
    EXPECT_NE(r.err.find("is a device"), std::string::npos) << r.err;
}

TEST_F(Hostile, LoraTagOnFifo) {
    const std::string d = sdtest::temp_dir();
    fifo_in(d, "y.safetensors");
    const auto r = refused({"--prompt", "a cat <lora:y:1>", "--lora-dir", d}, "y.safetensors");
    EXPECT_NE(r.err.find("FIFO"), std::string::npos) << r.err;
}

TEST_F(Hostile, EmbeddingFifo) {
    const std::string f = fifo_in(sdtest::temp_dir(), "e.safetensors");
    refused({"--prompt", "a cat", "--embedding", f}, "e.safetensors is a FIFO");
}

TEST_F(Hostile, TaesdAndPreviewDecoderFifo) {
    const std::string d = sdtest::temp_dir();
    refused({"--prompt", "a cat", "--vae-decoder", "taesd:" + fifo_in(d, "t.pth")}, "t.pth is a FIFO");
    refused({"--prompt", "a cat", "--preview", "1", "--preview-decoder", "taesd:" + zero_link(d, "p.pth")},
            "p.pth is a device");
}

TEST_F(Hostile, VaeOnDevZeroLink) {
    refused({"--prompt", "a cat", "--vae", zero_link(sdtest::temp_dir(), "v.safetensors")}, "v.safetensors is a device");
}

// A model folder whose UNet weights are a FIFO: the stage loader refuses it by name.
TEST_F(Hostile, ModelStageWeightsFifo) {
    const std::string model = sdtest::temp_dir() + "/m";
    fs::create_directory(model);
    for (const auto& e : fs::directory_iterator(sdtest::test_models() + "/tiny-st"))
        if (e.path().filename() != "unet.weights") fs::create_symlink(e.path(), model + "/" + e.path().filename().string());
    fifo_in(model, "unet.weights");
    auto a = args({"--prompt", "a cat"});
    a[2] = model;
    sdtest::expect_refused(a, out_, "unet.weights is a FIFO");
}

// --- 2. the pickle/zip reader's memory is bounded before it is taken ---

TEST_F(Hostile, StrideZeroViewAsEmbeddingTaesdAndVae) {
    refused({"--prompt", "a cat", "--embedding", crafted("stride0.pt")}, "stride0.pt");
    refused({"--prompt", "a cat", "--vae-decoder", "taesd:" + crafted("stride0.pth")}, "stride0.pth");
    refused({"--prompt", "a cat", "--vae", crafted("stride0.ckpt")}, "stride0.ckpt");
}

TEST_F(Hostile, DeflatedGigabyteRecord) {
    const auto r = refused({"--prompt", "a cat", "--embedding", crafted("big_record.pt")}, "big_record.pt");
    EXPECT_NE(r.err.find("storage"), std::string::npos) << r.err;
}

TEST_F(Hostile, PickleOfRepeatedOpcodes) {
    const auto r = refused({"--prompt", "a cat", "--embedding", crafted("opcodes.pt")}, "opcodes.pt");
    EXPECT_NE(r.err.find("limit"), std::string::npos) << r.err;
}

TEST_F(Hostile, ThousandsOfViewsOfOneStorage) {
    const auto r = refused({"--prompt", "a cat", "--vae-decoder", "taesd:" + crafted("views.pth")}, "views.pth");
    EXPECT_NE(r.err.find("limit"), std::string::npos) << r.err;
}

// --- 4. values: weights at parse time, tensors when read ---

TEST_F(Hostile, LoraWeightsOutOfRangeOrNotANumber) {
    const std::string good = sdtest::fixtures() + "/lora/lora_a.safetensors";
    auto r = refused({"--prompt", "a cat", "--lora", good + ":1e300"}, "--lora");
    EXPECT_NE(r.err.find("1e300"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("text_encoder"), std::string::npos) << r.err;
    r = refused({"--prompt", "a cat", "--lora", good + ":nan"}, "not a number");
    EXPECT_EQ(r.err.find("does not exist"), std::string::npos) << r.err;
    const std::string d = sdtest::temp_dir();
    fs::copy_file(good, d + "/x.safetensors");
    r = refused({"--prompt", "a cat <lora:x:3.5e38>", "--lora-dir", d}, "<lora:x:3.5e38>");
    EXPECT_NE(r.err.find("outside"), std::string::npos) << r.err;
    refused({"--prompt", "a cat <lora:x:1:1e30>", "--lora-dir", d}, "<lora:x:1:1e30>");
}

TEST_F(Hostile, FolderNamedLikeALora) {
    const std::string d = sdtest::temp_dir();
    fs::create_directory(d + "/x.safetensors");
    refused({"--prompt", "a cat", "--lora", d + "/x.safetensors"}, "x.safetensors is a folder");
}

TEST_F(Hostile, NanLoraAndNanEmbedding) {
    auto l = refused({"--prompt", "a cat", "--lora", crafted("nan_lora.safetensors")}, "nan_lora.safetensors");
    EXPECT_NE(l.err.find(": its tensor lora_"), std::string::npos) << l.err;
    EXPECT_NE(l.err.find(".weight holds NaN or infinite values"), std::string::npos) << l.err;
    const auto r = refused({"--prompt", "a cat", "--embedding", crafted("nan_emb.safetensors")}, "nan_emb.safetensors");
    EXPECT_NE(r.err.find("emb_params"), std::string::npos) << r.err;
}

// --- 7. trigger words: exact case, unique, typeable ---

TEST_F(Hostile, TwoTriggersDifferingOnlyInCase) {
    const std::string d = sdtest::temp_dir();
    fs::copy_file(sdtest::fixtures() + "/embeddings/embone.safetensors", d + "/Emb.safetensors");
    fs::copy_file(sdtest::fixtures() + "/embeddings/embone.safetensors", d + "/emb.safetensors");
    const auto r = refused({"--prompt", "a cat", "--embeddings-dir", d}, "Emb.safetensors");
    EXPECT_NE(r.err.find("/emb.safetensors"), std::string::npos) << r.err;
}

TEST_F(Hostile, ReservedAndSyntaxTriggers) {
    refused({"--prompt", "a cat", "--embedding", crafted("break_key.safetensors")}, "break_key.safetensors");
    const auto r = refused({"--prompt", "a cat", "--embedding", crafted("paren_key.safetensors")}, "paren_key.safetensors");
    EXPECT_NE(r.err.find("a character of the prompt syntax"), std::string::npos) << r.err;
}

// --- 9. reader messages ---

// An integer tensor where TAESD needs floats: its dtype, not "lacks the tensor".
TEST_F(Hostile, IntegerTaesdTensorNamesItsDtype) {
    const std::string src = sdtest::fixtures() + "/taesd/taesd_tiny/diffusion_pytorch_model.safetensors";
    std::string bytes = sdtest::read_text(src);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
    auto header = nlohmann::json::parse(bytes.substr(8, n));
    ASSERT_TRUE(header.contains("decoder.layers.0.bias"));
    ASSERT_EQ(header["decoder.layers.0.bias"]["dtype"], "F32");
    header["decoder.layers.0.bias"]["dtype"] = "I32";
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    const std::string file = sdtest::temp_dir() + "/int.safetensors";
    sdtest::write_text(file, len + text + bytes.substr(8 + n));
    const auto r = refused({"--prompt", "a cat", "--vae-decoder", "taesd:" + file}, "int.safetensors");
    EXPECT_NE(r.err.find("has dtype I32, expected a float type"), std::string::npos) << r.err;
}
