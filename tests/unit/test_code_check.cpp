// The check of a model file's TorchScript code (io/code_check.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sd/error.h"
#include "test_util.h"
#include "io/code_check.h"

// The ways TorchScript source can name an operation, read as the loader reads code/
// records (src/io/code_check.h): the exports' own forms pass, the others are named.
TEST(CodeCheck, ReadsEveryWayToNameAnOperation) {
    for (const char* ok : {"_12 = torch.conv2d(input, weight, bias, [1, 1], [1, 1], [1, 1])",
                           "_8 = torch.to(weight, ops.prim.dtype(x))", "_0 = getattr(input_blocks, \"0\")",
                           "_0 = __torch__.sd_modules.___torch_mangle_12.Linear",
                           "  norm_type : Final[float] = 2.\n  padding_idx : Final[NoneType] = None",
                           "h = (self.in_layers).forward(x, )", "eps: float=1.0000000000000001e-05) -> Tensor:"})
        EXPECT_EQ(sd::unlisted_code_name(ok), "") << ok;
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"t = torch.from_file(p, True, 16, dtype=0)", "torch.from_file"},
        {"t = torch.autograd.from_file(p, True, 16)", "torch.from_file"},
        {"t = ops.aten.from_file(p, True, 16)", "ops.aten.from_file"},
        {"f = torch\n    t = f.from_file(p, True, 16)", "torch"},
        {"o = ops.aten", "ops.aten"},
        {"f = getattr(torch, \"from_file\")", "torch"},
        {"f = getattr(self, \"from_file\")", "getattr(self, \"from_file\")"},
        {"f = getattr(x, \"0\" \"a\")", "getattr(x, \"0\" \"a\")"},
        {"_0 = torch.fill_(x, 1.)", "torch.fill_"},
        {"_0 = (x).fill_(1.)", ".fill_"},
        {"_0 = torch.to(x, 6).fill_(1.)", ".fill_"},
        {"s = \"{}\".format(x)", ".format"},
        {"y = (x # __torch__\n    .fill_(1.))", ".fill_"},
        {"t = (torch # a comment\n    .from_file(p))", "torch"},
        {"t = 2.from_file", ".from_file"},
        {"c = __torch__.torch.classes.quantized.LinearPackedParamsBase", ".classes"},
        {"class M(Module):\n  x : Tensor\n  def __setstate__(self: __torch__.M, s: str) -> None:\n"
         "    self.x = torch.to(torch.from_file(s, True, 16, dtype=0), 6)",
         "torch.from_file"},  // an operation is named before an unknown class met earlier
    };
    for (const auto& [code, name] : refused) EXPECT_EQ(sd::unlisted_code_name(code), name) << code;
    EXPECT_TRUE(sd::code_name_listed("torch.conv2d"));
    for (const char* never : {"torch.from_file", "torch.save", "ops.aten.from_file", ".classes", ".from_file"})
        EXPECT_FALSE(sd::code_name_listed(never)) << never;
}
