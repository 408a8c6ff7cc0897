// Which operations a TorchScript model file's code uses, against the list of those this
// tool's own export emits (src/io/op_allowlist.inc, written by scripts/gen_op_allowlist.py).
// Loading a .pt runs its code (a scripted __setstate__ runs during the load), so the
// loader reads the code/ records first and refuses code that names anything else.
#pragma once
#include <string>
#include <string_view>

namespace sd {

// A name in TorchScript source that is not on the list, or a construct refused outright
// (torch or ops used as a value, getattr with a name other than a module list index);
// "" when the code passes. The first unlisted operation is preferred to an earlier
// unlisted attribute or class name. Names are read the way scripts/gen_op_allowlist.py
// reads them: "torch.NAME", "ops.NS.NAME", ".NAME" (any other name after a dot, so
// LibTorch's custom classes, __torch__.torch.classes.*, are never on the list).
std::string unlisted_code_name(std::string_view code);

// Whether a name is on the list (for tests).
bool code_name_listed(std::string_view name);

}  // namespace sd
