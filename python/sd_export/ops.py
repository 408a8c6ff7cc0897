"""The custom operators the exported modules call.

``sd::attention(q, k, v, heads, scale)``: softmax(q kᵀ · scale) v for each head,
q [B, n, heads*d], k and v [B, m, heads*d] -> [B, n, heads*d]. The C++ program
registers its fused kernel under this name (src/engine/operators.cpp);
here it gets the plain per-head computation so that ``torch.jit.script``
compiles the calls and Python can run the exported modules. Loading
``libsd_engine.so`` first (``torch.ops.load_library``) makes Python use the
C++ kernel instead: the benchmark's profile does that.

``sd::linear(x, w, b)``: F.linear, which the C++ program computes with oneDNN
(LibTorch 1.13 sends Linear to OpenBLAS, 3x slower on the UNet's shapes here).

``sd::geglu(h, bias)`` (GEGLU after its projection without bias), ``sd::layer_norm(x, w, b, eps)``, ``sd::group_norm(x, groups, w, b,
eps)``: GEGLU's gate and the two norms computed in fp32 and returned in the input's
dtype. The modules call them for bf16 activations only (fp32 keeps its own code);
the C++ program runs them in one pass each on bf16 (src/kernels/bf16_rows.h).

``sd::expand_q8(w, scale)``: an 8-bit layer's fp32 weight, int8 ``w`` times its fp16
``scale`` per block of 32 values of a row (layers.py ``_expand``); the C++ program
writes it in one pass instead of TorchScript's two full-size temporaries.

``sd::conv3x3(x, w, b)``: a 3x3 convolution of stride 1 and padding 1. The modules call
it for bf16 activations only; the C++ program runs the larger ones by Winograd's
algorithm (src/kernels/winograd_bf16.h).

``sd::conv1x1(x, w, b)``: a 1x1 convolution of stride 1, for bf16 activations only; the C++
program runs it as one matrix product per image (src/kernels/pointwise_bf16.h).
"""

from typing import Optional

import torch
import torch.nn.functional as F

_LIB = None


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, scale: float) -> torch.Tensor:
    d = q.shape[2] // heads
    outs = []
    for h in range(heads):
        qh = q[:, :, h * d:(h + 1) * d].contiguous().float()
        kh = k[:, :, h * d:(h + 1) * d].contiguous().float()
        vh = v[:, :, h * d:(h + 1) * d].contiguous()
        w = (torch.bmm(qh, kh.transpose(1, 2)) * scale).softmax(dim=-1).to(v.dtype)
        outs.append(torch.bmm(w, vh))
    return torch.cat(outs, 2)


def reference_linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return F.linear(x, w, b)


def reference_geglu(h: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    h32 = h.float() if bias is None else h.float() + bias.float()
    x, gate = h32.chunk(2, dim=-1)
    return (x * F.gelu(gate)).to(h.dtype)


def reference_layer_norm(x: torch.Tensor, w: Optional[torch.Tensor], b: Optional[torch.Tensor],
                         eps: float) -> torch.Tensor:
    w32 = None if w is None else w.float()
    b32 = None if b is None else b.float()
    return F.layer_norm(x.float(), (x.shape[-1],), w32, b32, eps).to(x.dtype)


def reference_group_norm(x: torch.Tensor, groups: int, w: Optional[torch.Tensor], b: Optional[torch.Tensor],
                         eps: float) -> torch.Tensor:
    w32 = None if w is None else w.float()
    b32 = None if b is None else b.float()
    return F.group_norm(x.float(), groups, w32, b32, eps).to(x.dtype)


def reference_expand_q8(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    blocks = w.reshape(scale.shape[0], scale.shape[1], 32).float() * scale.float().unsqueeze(2)
    return blocks.reshape(w.shape)


def reference_conv3x3(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return F.conv2d(x, w, b, padding=1)


def reference_conv1x1(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return F.conv2d(x, w, b)


def register():
    """Defines sd::attention and sd::linear unless something (the C++ engine) already has."""
    global _LIB
    if _LIB is not None:
        return
    try:
        torch.ops.sd.attention  # noqa: B018 - raises when the op is not defined
        torch.ops.sd.linear  # noqa: B018
        torch.ops.sd.geglu  # noqa: B018
        torch.ops.sd.expand_q8  # noqa: B018
        torch.ops.sd.conv3x3  # noqa: B018
        torch.ops.sd.conv1x1  # noqa: B018
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("sd", "DEF")
    lib.define("attention(Tensor q, Tensor k, Tensor v, int heads, float scale) -> Tensor")
    # CompositeImplicitAutograd: the one definition serves CPU, CUDA and meta tensors.
    lib.impl("attention", reference_attention, "CompositeImplicitAutograd")
    lib.define("linear(Tensor x, Tensor w, Tensor? b) -> Tensor")
    lib.impl("linear", reference_linear, "CompositeImplicitAutograd")
    lib.define("geglu(Tensor h, Tensor? bias) -> Tensor")
    lib.impl("geglu", reference_geglu, "CompositeImplicitAutograd")
    lib.define("layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor")
    lib.impl("layer_norm", reference_layer_norm, "CompositeImplicitAutograd")
    lib.define("group_norm(Tensor x, int groups, Tensor? weight, Tensor? bias, float eps) -> Tensor")
    lib.impl("group_norm", reference_group_norm, "CompositeImplicitAutograd")
    lib.define("expand_q8(Tensor w, Tensor scale) -> Tensor")
    lib.impl("expand_q8", reference_expand_q8, "CompositeImplicitAutograd")
    lib.define("conv3x3(Tensor x, Tensor w, Tensor? b) -> Tensor")
    lib.impl("conv3x3", reference_conv3x3, "CompositeImplicitAutograd")
    lib.define("conv1x1(Tensor x, Tensor w, Tensor? b) -> Tensor")
    lib.impl("conv1x1", reference_conv1x1, "CompositeImplicitAutograd")
    _LIB = lib

register()
