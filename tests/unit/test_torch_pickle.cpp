// The pickle of a torch.save archive (io/torch_pickle.h), on pickles written
// here opcode by opcode: what torch.save writes reads back; calls of anything
// but the tensor rebuilders run nothing; damaged and hostile pickles end in
// sd::Error, never a crash or a hang.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "io/torch_pickle.h"
#include "sd/error.h"

namespace {

// Opcodes of pickle protocol 2, as torch.save writes them.
struct Pickle {
    std::string b = "\x80\x02";
    Pickle& op(char c) { return b += c, *this; }
    Pickle& str(const std::string& s) {  // SHORT_BINUNICODE
        b += '\x8c';
        b += static_cast<char>(s.size());
        b += s;
        return *this;
    }
    Pickle& num(int v) { return b += 'K', b += static_cast<char>(v), *this; }  // BININT1
    Pickle& global(const std::string& module, const std::string& name) { return b += "c" + module + "\n" + name + "\n", *this; }
    // _rebuild_tensor_v2(('storage', torch.<type>, key, 'cpu', numel), offset, size, stride, False, OrderedDict())
    Pickle& tensor(const std::string& type, const std::string& key, int numel, int offset, std::vector<int> size,
                   std::vector<int> stride) {
        global("torch._utils", "_rebuild_tensor_v2").op('(');
        op('(').str("storage").global("torch", type).str(key).str("cpu").num(numel).op('t').op('Q');
        num(offset).op('(');
        for (int s : size) num(s);
        op('t').op('(');
        for (int s : stride) num(s);
        op('t').op('\x89').global("collections", "OrderedDict").op(')').op('R').op('t').op('R');
        return *this;
    }
    std::string done() { return b + "."; }
};

std::vector<sd::PickledTensor> parse(const std::string& bytes) { return sd::parse_torch_pickle(bytes, "test.pt"); }

}  // namespace

TEST(TorchPickle, ReadsTensorsInNestedDictsWithTheirStorageAndLayout) {
    Pickle p;
    p.op('}').op('q').b += '\0';
    p.op('(').str("state_dict").op('}').op('(').str("w").tensor("HalfStorage", "0", 6, 0, {2, 3}, {1, 2});
    p.str("b").tensor("FloatStorage", "1", 4, 1, {3}, {1}).op('u');
    p.str("step").num(7).op('u');
    const auto t = parse(p.done());
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[0].name, "state_dict.w");
    EXPECT_EQ(t[0].dtype, "F16");
    EXPECT_EQ(t[0].storage, "0");
    EXPECT_EQ(t[0].shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(t[0].stride, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(t[1].name, "state_dict.b");
    EXPECT_EQ(t[1].dtype, "F32");
    EXPECT_EQ(t[1].offset, 1);
}

TEST(TorchPickle, TensorsReachingPastTheirStorageAreRefused) {
    for (auto [numel, offset] : {std::pair{5, 0}, std::pair{6, 1}}) {
        Pickle p;
        p.op('}').op('(').str("w").tensor("FloatStorage", "0", numel, offset, {2, 3}, {3, 1}).op('u');
        EXPECT_THROW(parse(p.done()), sd::Error) << numel << " " << offset;
    }
    Pickle huge;  // sizes whose product overflows int64 if multiplied unchecked
    huge.op('}').op('(').str("w");
    huge.global("torch._utils", "_rebuild_tensor_v2").op('(');
    huge.op('(').str("storage").global("torch", "FloatStorage").str("0").str("cpu").num(4).op('t').op('Q').num(0);
    huge.b += "(\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x3f\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x3ft(K\x01K\x01t\x89)tR";
    EXPECT_THROW(parse(huge.op('u').done()), sd::Error);
}

// A pickle names Python callables; this reader calls none of them. A call of
// anything but the tensor rebuilders is an opaque value holding nothing.
TEST(TorchPickle, CallsOfOtherGlobalsRunNothingAndHoldNoTensors) {
    Pickle p;
    p.op('}').op('(').str("evil").global("os", "system").op('(').str("touch /tmp/pwned").op('t').op('R');
    p.str("ok").tensor("FloatStorage", "0", 1, 0, {1}, {1}).op('u');
    const auto t = parse(p.done());
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].name, "ok");
    Pickle hidden;  // a tensor passed to an unknown call is not collected either
    hidden.op('}').op('(').str("x").global("builtins", "eval").op('(');
    hidden.tensor("FloatStorage", "0", 1, 0, {1}, {1}).op('t').op('R').op('u');
    EXPECT_TRUE(parse(hidden.done()).empty());
}

TEST(TorchPickle, EveryCutOfAValidPickleIsRefused) {
    Pickle p;
    p.op('}').op('(').str("w").tensor("HalfStorage", "0", 6, 0, {2, 3}, {3, 1}).op('u');
    const std::string whole = p.done();
    ASSERT_EQ(parse(whole).size(), 1u);
    for (size_t n = 0; n < whole.size(); ++n) EXPECT_THROW(parse(whole.substr(0, n)), sd::Error) << n;
}

// The memo lets a pickle put a list inside itself, or share one list twice at
// every level (2^60 paths): both end quickly with an error.
TEST(TorchPickle, SelfReferenceAndExponentialSharingEndInAnError) {
    Pickle self;
    self.op(']').op('q').b += '\0';
    self.op('h').b += '\0';
    self.op('a');
    EXPECT_THROW(parse(self.done()), sd::Error);

    Pickle shared;
    shared.op(']');
    for (int k = 0; k < 60; ++k) shared.op('2').op('\x86');  // DUP, TUPLE2: (x, x)
    EXPECT_THROW(parse(shared.done()), sd::Error);
}

TEST(TorchPickle, UnknownOpcodesAndStorageTypesAreNamed) {
    try {
        parse(std::string("\x80\x02\xff."));
        FAIL() << "no error";
    } catch (const sd::Error& e) {
        EXPECT_NE(std::string(e.what()).find("opcode 0xff"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("test.pt"), std::string::npos) << e.what();
    }
    Pickle p;
    p.op('}').op('(').str("w").tensor("QInt8Storage", "0", 1, 0, {1}, {1}).op('u');
    EXPECT_THROW(parse(p.done()), sd::Error);
}

// The seed corpus holds data.pkl of the fixtures' .pt/.pth files (written by
// torch.save itself): they read, with the names the fixture READMEs give.
TEST(TorchPickle, PicklesWrittenByTorchSaveRead) {
    auto read = [](const std::string& name) {
        std::ifstream f(std::string(SD_SOURCE_DIR) + "/tests/fuzz/corpus/torch_pickle/" + name, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
    };
    const auto emb = parse(read("embthree.pkl"));
    ASSERT_EQ(emb.size(), 1u);
    EXPECT_EQ(emb[0].name, "string_to_param.*");
    EXPECT_EQ(emb[0].shape, (std::vector<int64_t>{3, 32}));
    const auto taesd = parse(read("taesd_decoder.pkl"));
    EXPECT_EQ(taesd.size(), 67u);
    for (const auto& t : taesd) EXPECT_EQ(t.dtype, "F16") << t.name;
}

// Issue 32: hard limits, each before the memory it guards is taken. A run of
// ')' '0' grows only the reader's own values; '(' only its marks; a long
// string fetched from the memo over and over only its copies.
TEST(TorchPickle, HostileOpcodeRunsHitALimit) {
    const auto message = [](const std::string& bytes) {
        try {
            parse(bytes);
        } catch (const sd::Error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    std::string tuples = "\x80\x02";
    for (int i = 0; i < 1000000; ++i) tuples += ")0";
    EXPECT_NE(message(tuples + "}.").find("MiB of memory, this reader's limit"), std::string::npos) << message(tuples + "}.");
    const std::string marks = "\x80\x02" + std::string(1100000, '(') + "}.";
    EXPECT_NE(message(marks).find("marks"), std::string::npos) << message(marks);
    std::string stack = "\x80\x02}";
    for (int i = 0; i < 1100000; ++i) stack += '2';  // DUP
    EXPECT_NE(message(stack + ".").find("stack deeper"), std::string::npos);
    std::string memo = "\x80\x02}";
    for (uint32_t i = 0; i < 300000; ++i) {
        memo += 'r';
        for (int k = 0; k < 4; ++k) memo += static_cast<char>(i >> (8 * k));
    }
    EXPECT_NE(message(memo + ".").find("memo entries"), std::string::npos) << message(memo + ".");
    // A 100 KB string copied into a global name again and again.
    std::string copies = "\x80\x02X" + std::string("\xa0\x86\x01\x00", 4) + std::string(100000, 'm') + "q\x01";
    for (int i = 0; i < 2000; ++i) copies += "h\x01h\x01\x93" "0";
    EXPECT_NE(message(copies + "}.").find("limit"), std::string::npos) << message(copies + "}.");
}

// A stride-0 view (torch.zeros(1).expand(1 << 24, 32)) is accepted by the pickle
// reader as what it is, one element of storage; what it would materialise is
// counted by io/tensor_reader.h before any copy.
TEST(TorchPickle, StrideZeroViewKeepsItsLayout) {
    const auto t = parse(Pickle().tensor("FloatStorage", "0", 1, 0, {100, 32}, {0, 0}).done());
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].storage_numel, 1);
    EXPECT_EQ(t[0].stride, (std::vector<int64_t>{0, 0}));
}
