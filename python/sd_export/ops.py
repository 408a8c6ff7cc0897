"""The custom operator the exported modules call for fused attention.

``sd::attention(q, k, v, heads, scale)``: softmax(q kᵀ · scale) v for each head,
q [B, n, heads*d], k and v [B, m, heads*d] -> [B, n, heads*d]. The C++ program
registers its fused kernel under this name (src/engine/fused_attention.cpp);
here it gets the plain per-head computation so that ``torch.jit.script``
compiles the calls and Python can run the exported modules. Loading
``libsd_engine.so`` first (``torch.ops.load_library``) makes Python use the
C++ kernel instead: the benchmark's profile does that.
"""

import torch

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


def register():
    """Defines sd::attention unless something (the C++ engine) already has."""
    global _LIB
    if _LIB is not None:
        return
    try:
        torch.ops.sd.attention  # noqa: B018 - raises when the op is not defined
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("sd", "DEF")
    lib.define("attention(Tensor q, Tensor k, Tensor v, int heads, float scale) -> Tensor")
    # CompositeImplicitAutograd: the one definition serves CPU, CUDA and meta tensors.
    lib.impl("attention", reference_attention, "CompositeImplicitAutograd")
    _LIB = lib

register()
