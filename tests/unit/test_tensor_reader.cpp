// The one tensor-file reader (io/tensor_reader.h), without LibTorch: torch.save
// zip archives (stored and deflated records), strided views gathered in order,
// .safetensors, the hashes from the same open file, and the refusals that keep
// memory bounded (issue 31 part 3, issue 32 point 2).
#include <gtest/gtest.h>

#include <cstring>
#include <new>

#include "io/printable.h"
#include "io/sha256.h"
#include "io/tensor_reader.h"
#include "sd/error.h"
#include "test_util.h"

namespace {

// A zip written by Python's zipfile: data.pkl is the fuzz seed of the view
// torch.zeros(8, 6).t()[1:, ::2] (shape [5, 4], strides [1, 12], offset 1),
// its storage 48 floats 0, 1, ..., 47; `storage_floats` and `extra` vary it.
std::string make_zip(const std::string& name, bool deflate, int storage_floats = 48, const std::string& extra = "") {
    const std::string dir = sdtest::temp_dir(), path = dir + "/" + name;
    const std::string seed = sdtest::env("SD_SOURCE_DIR") + "/tests/fuzz/corpus/torch_pickle/strided_view.pkl";
    const std::string code =
        "import struct, sys, zipfile\n"
        "path, seed, deflate, n, extra = sys.argv[1], sys.argv[2], sys.argv[3] == '1', int(sys.argv[4]), sys.argv[5]\n"
        "with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:\n"
        "    z.writestr('archive/data.pkl', open(seed, 'rb').read())\n"
        "    z.writestr('archive/byteorder', 'little')\n"
        "    z.writestr('archive/data/0', struct.pack('<%df' % n, *range(n)))\n"
        "    if extra: z.writestr('archive/' + extra, 'x')\n";
    const auto r = sdtest::run({sdtest::env("SD_PYTHON"), "-c", code, path, seed, deflate ? "1" : "0",
                                std::to_string(storage_floats), extra});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return path;
}

std::vector<float> read_floats(sd::TensorReader& f, size_t k) {
    std::vector<float> v(f.tensors().at(k).bytes / 4);
    f.read({k}, [&](size_t) { return reinterpret_cast<char*>(v.data()); });
    return v;
}

std::string refusal(const std::function<void()>& f) {
    const std::string m = sdtest::error_of(f);
    return m.empty() ? "accepted" : m;
}

}  // namespace

TEST(TensorReader, StridedViewOfAZipArchiveStoredOrDeflated) {
    for (bool deflate : {false, true}) {
        const std::string path = make_zip("view.pt", deflate);
        sd::TensorReadOptions o;
        o.what = "test file";
        o.hash = true;
        sd::TensorReader f(path, o);
        EXPECT_FALSE(f.is_safetensors());
        ASSERT_EQ(f.tensors().size(), 1u);
        EXPECT_EQ(f.tensors()[0].name, "t");
        EXPECT_EQ(f.tensors()[0].shape, (std::vector<int64_t>{5, 4}));
        const auto v = read_floats(f, 0);
        ASSERT_EQ(v.size(), 20u);
        for (int i = 0; i < 5; ++i)
            for (int j = 0; j < 4; ++j) EXPECT_EQ(v[i * 4 + j], static_cast<float>(1 + i + 12 * j)) << i << "," << j;
        EXPECT_EQ(f.sha256(), sd::sha256_file_hex(path));
    }
}

TEST(TensorReader, SafetensorsTensorsAndDataHash) {
    const std::string path = sdtest::fixtures() + "/embeddings/embone.safetensors";
    sd::TensorReadOptions o;
    o.what = "embedding";
    o.hash = true;
    sd::TensorReader f(path, o);
    EXPECT_TRUE(f.is_safetensors());
    ASSERT_GE(f.find("emb_params"), 0);
    EXPECT_EQ(f.sha256(), sd::sha256_file_hex(path));
    const std::string bytes = sdtest::read_text(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
    EXPECT_EQ(f.data_sha256(), sd::sha256_hex(bytes.substr(8 + n)));
    const auto k = static_cast<size_t>(f.find("emb_params"));
    const auto& e = f.tensors()[k];
    std::string got(e.bytes, '\0');
    f.read({k}, [&](size_t) { return got.data(); });
    EXPECT_EQ(got, bytes.substr(f.safetensors_index()[k].begin, e.bytes));
}

TEST(TensorReader, MemoryLimitStorageSizeAndCodeRecordsAreRefused) {
    sd::TensorReadOptions o;
    o.what = "test file";
    o.max_bytes = 100;  // the view (80 bytes) and its storage (192) together are 272
    {
        sd::TensorReader f(make_zip("small.pt", false), o);
        const std::string m = refusal([&] { read_floats(f, 0); });
        EXPECT_NE(m.find("this reader's limit"), std::string::npos) << m;
    }
    o.max_bytes = 1 << 20;
    {
        // A record larger than its storage: a deflated record may stand for gigabytes.
        sd::TensorReader f(make_zip("big.pt", true, 4096), o);
        const std::string m = refusal([&] { read_floats(f, 0); });
        EXPECT_NE(m.find("holds 16384 bytes, its tensors declare 192"), std::string::npos) << m;
    }
    const std::string code = refusal([&] { sd::TensorReader(make_zip("ts.pt", false, 48, "code/x.py"), o); });
    EXPECT_NE(code.find("TorchScript"), std::string::npos) << code;
    const std::string dir = sdtest::temp_dir();
    EXPECT_NE(refusal([&] { sd::TensorReader(dir, o); }).find("is a folder"), std::string::npos);
    EXPECT_NE(refusal([&] { sd::TensorReader("/dev/zero", o); }).find("is a device"), std::string::npos);
    sdtest::write_text(dir + "/trunc.pt", sdtest::read_text(make_zip("t.pt", false)).substr(0, 300));
    const std::string trunc = refusal([&] { sd::TensorReader(dir + "/trunc.pt", o); });
    EXPECT_NE(trunc.find("trunc.pt"), std::string::npos) << trunc;
    EXPECT_EQ(trunc.find('\n'), std::string::npos) << trunc;
}

// Names from a file, printed in a one-line message: NUL, line breaks, raw bytes
// escaped; well-formed UTF-8 kept; long names cut.
TEST(Printable, EscapesWhatATerminalWouldNotShow) {
    EXPECT_EQ(sd::printable(std::string("a\0b\nc\x1b[31m\xff\\", 12)), "a\\x00b\\x0ac\\x1b[31m\\xff\\\\");
    EXPECT_EQ(sd::printable("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");
    EXPECT_EQ(sd::printable("\xc0\xaf\xed\xa0\x80"), "\\xc0\\xaf\\xed\\xa0\\x80");  // overlong, surrogate
    EXPECT_EQ(sd::printable(std::string(300, 'k'), 10), std::string(10, 'k') + "...");
}

// An allocation that fails while reading is "out of memory" naming the file,
// not "not a valid zip archive of tensors" (issue 32).
TEST(TensorReader, AllocationFailureIsReportedAsOutOfMemory) {
    for (bool deflate : {false, true}) {
        const std::string path = make_zip("oom.pt", deflate);
        sd::TensorReadOptions o;
        o.what = "test file";
        sd::TensorReader f(path, o);
        const std::string m = refusal([&] { f.read({0}, [](size_t) -> char* { throw std::bad_alloc(); }); });
        EXPECT_NE(m.find("cannot read " + path + ": out of memory"), std::string::npos) << m;
    }
}
