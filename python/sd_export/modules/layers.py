"""The layers the UNet and the VAE are built from instead of the torch.nn ones, and the
attention settings they share.

Attention (UNet ``CrossAttention`` and VAE ``AttnBlock``) reads two int attributes
at run time, set from C++ with ``setattr`` (see docs/model-format.md):
``attention_mode`` 0 = all heads in one batched matmul (the reference),
1 = one head at a time (default; bit-identical to 0, far less memory),
2 = one head at a time in chunks of ``attention_chunk`` query rows,
3 = fused: the ``sd::attention`` operator (sd_export/ops.py), which the C++
program implements with a kernel that never holds more than a tile of scores.
"""

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import blocked_ops  # noqa: F401 - defines torch.ops.sd_blocked.* for torch.jit.script
from .. import ops  # noqa: F401 - defines torch.ops.sd.attention and .linear for torch.jit.script

# attention_mode values (TorchScript cannot read module globals, so forward() uses the literals).
ATTN_ALL_HEADS = 0
ATTN_PER_HEAD = 1
ATTN_CHUNKED = 2
ATTN_FUSED = 3
DEFAULT_ATTENTION_MODE = ATTN_PER_HEAD
DEFAULT_ATTENTION_CHUNK = 256


# The UNet and the VAE are built from these instead of the torch.nn ones.
# Their weights may be held in another dtype than they compute in (fp16 weights
# with fp32 compute on a CPU, `--weights fp16`): each layer casts its weights to
# the input's dtype as it runs, so only one layer's fp32 copy exists at a time.
# With matching dtypes `.to` returns the tensor itself: no copy, same results.


def _cast(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    if t is None:
        return None
    return t.to(dtype)


# 8-bit weights (`--weights q8`, src/engine/q8_weights.h): the C++ program may hold a
# layer's weight as int8 with one fp16 scale per block of 32 values along each output
# row (GGUF's q8_0 blocks), the scales [out, row / 32] in `weight_scale`. The layer
# expands it as it runs: value = scale * q, one product in the compute dtype (exact in
# fp32, so a q8_0 GGUF's weights compute as ggml's to_float gives them).
def _expand(w: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    if scale is None:
        return w.to(dtype)
    if dtype == torch.float32:  # the same products, in one pass (ops.py)
        return torch.ops.sd.expand_q8(w, scale)
    blocks = w.reshape(scale.shape[0], scale.shape[1], 32).to(dtype) * scale.to(dtype).unsqueeze(2)
    return blocks.reshape(w.shape)


class Linear(nn.Linear):
    """F.linear through sd::linear (sd_export/ops.py): the C++ program runs it
    with oneDNN instead of LibTorch's OpenBLAS path."""

    weight_scale: Optional[torch.Tensor]  # None, or the 8-bit weight's scales (_expand)

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.weight_scale = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.sd.linear(x, _expand(self.weight, self.weight_scale, x.dtype), _cast(self.bias, x.dtype))


class Conv2d(nn.Conv2d):
    """A Conv2d that can also run in slices of output channels: `conv_split`
    (bytes, set from C++ like the attention attributes; 0 = whole) caps the
    weight bytes of one call, since oneDNN copies a conv's whole weight into
    its own layout on every call and the largest SD 1.x weight is 118 MB.
    The C++ program may instead replace the weight, once at load, by oneDNN's
    own layout (an mkldnn tensor, src/engine/stage_loader.cpp "prepack"): the
    layer then convolves with it directly and nothing is copied per call."""

    weight_scale: Optional[torch.Tensor]  # None, or the 8-bit weight's scales (_expand)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.conv_split: int = 0
        self.weight_scale = None
        # The UNet's and the VAE's bf16 3x3 layers of stride 1 and padding 1 call sd::conv3x3
        # (ops.py), which the C++ program runs by Winograd's algorithm; fp32 keeps the code below.
        self.unit_3x3: bool = kernel_size == 3 and stride == 1 and padding == 1
        # bf16 1x1 layers of stride 1 call sd::conv1x1: one matrix product per image in C++.
        self.unit_1x1: bool = kernel_size == 1 and stride == 1 and padding == 0
        # Where the input's size is, from the latent's: the UNet's layers at latent / latent_div
        # (1, 2, 4, ...), the VAE's at latent x latent_mul (1, 2, 4, 8); 0 and 0 elsewhere. The C++
        # program leaves the weight plain where sd::conv3x3 will take it (stage_loader.cpp).
        self.latent_div: int = 0
        self.latent_mul: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.is_mkldnn:  # prepacked (fp32 on the CPU only)
            return torch.mkldnn_convolution(x.to_mkldnn(), w, self.bias, self.padding, self.stride, self.dilation,
                                            self.groups).to_dense()
        out_ch = w.shape[0]
        per_call = out_ch
        if self.conv_split > 0:
            per_call = max(1, self.conv_split // (w[0].numel() * 4))
        scale = self.weight_scale
        if per_call >= out_ch:
            return self._conv(x, _expand(w, scale, x.dtype), _cast(self.bias, x.dtype))
        parts: List[torch.Tensor] = []
        for start in range(0, out_ch, per_call):
            b = self.bias
            if b is not None:
                b = b[start:start + per_call].to(x.dtype)
            part_scale = scale
            if part_scale is not None:
                part_scale = part_scale[start:start + per_call]
            parts.append(self._conv(x, _expand(w[start:start + per_call], part_scale, x.dtype), b))
        return torch.cat(parts, 1)

    def _conv(self, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
        if self.unit_3x3 and (self.latent_div > 0 or self.latent_mul > 0) and x.dtype == torch.bfloat16:
            return torch.ops.sd.conv3x3(x, w, b)
        if self.unit_1x1 and x.dtype == torch.bfloat16:
            return torch.ops.sd.conv1x1(x, w, b)
        return self._conv_forward(x, w, b)


# The blocked route (sd_export/blocked_ops.py): the ResNet blocks, Upsample and
# Downsample carry an int attribute `blocked`, 0 = their own code (the reference),
# else the channel block (16, 8) of one sd_blocked operator call, set from C++ at
# load with their convolution weights packed (src/engine/stage_loader.h
# prepack_blocked). Such a block passes its result on in the blocked layout unless a
# layer that needs a plain tensor follows it (`plain_out`); anything else that may
# receive one calls plain_layout first.
def plain_layout(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 5:
        return torch.ops.sd_blocked.to_plain(x)
    return x


# The norms compute in fp32 whatever the input dtype (half or bf16 compute on a
# GPU, as autocast does); for fp32 input `.float()` is the tensor itself. bf16
# goes to sd::group_norm / sd::layer_norm (ops.py): the same arithmetic, which
# the C++ program does in one pass instead of a widening copy, the norm and a
# narrowing copy.
class GroupNorm(nn.GroupNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16:
            return torch.ops.sd.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return F.group_norm(x.float(), self.num_groups, _cast(self.weight, torch.float32),
                            _cast(self.bias, torch.float32), self.eps).to(x.dtype)


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16 and len(self.normalized_shape) == 1:
            return torch.ops.sd.layer_norm(x, self.weight, self.bias, self.eps)
        return F.layer_norm(x.float(), self.normalized_shape, _cast(self.weight, torch.float32),
                            _cast(self.bias, torch.float32), self.eps).to(x.dtype)
