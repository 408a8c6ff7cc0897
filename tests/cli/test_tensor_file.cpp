// Tensors from downloaded files (engine/tensor_file.h): the fixtures' torch.save
// archives and .safetensors files read back as their READMEs describe them;
// TorchScript programs, the old torch.save format and damaged files are
// refused with one line naming the file.
#include <gtest/gtest.h>

#include <map>

#include "conformance_util.h"
#include "engine/tensor_file.h"
#include "sd/error.h"
#include "test_util.h"

namespace {

std::map<std::string, at::Tensor> read_all(const std::string& path) {
    std::map<std::string, at::Tensor> m;
    for (auto& [name, t] : sd::read_tensor_file(path)) m.emplace(name, t);
    return m;
}

std::string error_of(const std::string& path) {
    try {
        sd::read_tensor_file(path);
    } catch (const sd::Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(TensorFile, TextualInversionFilesHoldTheirVectors) {
    const std::string dir = sdtest::fixtures() + "/embeddings/";
    for (const char* name : {"embone", "embthree"}) {
        const at::Tensor want = sdtest::load_tensor(dir + "vectors_" + name + ".npy");
        const auto pt = read_all(dir + name + ".pt");
        ASSERT_TRUE(pt.count("string_to_param.*")) << name;
        EXPECT_TRUE(at::equal(pt.at("string_to_param.*").to(at::kFloat), want)) << name;
        const auto st = read_all(dir + name + ".safetensors");
        ASSERT_TRUE(st.count("emb_params")) << name;
        EXPECT_TRUE(at::equal(st.at("emb_params"), want)) << name;
    }
}

TEST(TensorFile, TaesdPthKeepsItsKeysShapesAndHalfPrecision) {
    const auto m = read_all(sdtest::fixtures() + "/taesd/taesd_decoder.pth");
    EXPECT_EQ(m.size(), 67u);
    ASSERT_TRUE(m.count("1.weight"));
    EXPECT_EQ(m.at("1.weight").sizes(), (at::IntArrayRef{64, 4, 3, 3}));
    EXPECT_EQ(m.at("1.weight").scalar_type(), at::kHalf);
    EXPECT_EQ(m.at("19.weight").sizes(), (at::IntArrayRef{3, 64, 3, 3}));
}

// tiny.ckpt is the fixture's .safetensors saved by torch.save as {"state_dict": ...}
// (tests/make_ckpt.py): every tensor equal to the .safetensors one.
TEST(TensorFile, CheckpointMatchesItsSafetensorsTwin) {
    const auto ckpt = read_all(sdtest::test_models() + "/tiny.ckpt");
    const auto st = read_all(sdtest::fixtures() + "/tiny/tiny.safetensors");
    ASSERT_FALSE(st.empty());
    for (const auto& [name, t] : st) {
        auto it = ckpt.find("state_dict." + name);
        ASSERT_NE(it, ckpt.end()) << name;
        EXPECT_TRUE(at::equal(it->second, t)) << name;
    }
}

TEST(TensorFile, ProgramsOldFormatsAndDamagedFilesAreRefusedNamingTheFile) {
    const std::string dir = sdtest::temp_dir();
    const std::string pt = sdtest::read_text(sdtest::fixtures() + "/embeddings/embone.pt");
    sdtest::write_text(dir + "/half.pt", pt.substr(0, pt.size() / 2));
    sdtest::write_text(dir + "/old.pt", std::string("\x80\x02}q\x00.", 6));
    sdtest::write_text(dir + "/noise.bin", std::string(300, '\x17'));
    sdtest::write_text(dir + "/empty.safetensors", "");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {sdtest::test_models() + "/tiny-st/unet.pt", "TorchScript program"},
        {dir + "/old.pt", "before PyTorch 1.6"},
        {dir + "/half.pt", "half.pt"},
        {dir + "/noise.bin", "noise.bin"},
        {dir + "/empty.safetensors", "empty.safetensors"},
        {dir + "/absent.pt", "absent.pt does not exist"},
        {"/dev/zero", "/dev/zero is a device"},
    };
    for (const auto& [path, says] : cases) {
        const std::string e = error_of(path);
        EXPECT_NE(e.find(says), std::string::npos) << path << ": " << e;
        EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    }
}
