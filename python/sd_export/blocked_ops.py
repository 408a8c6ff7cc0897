"""The operators of the blocked route: the UNet's and the VAE's ResNet blocks as one call each.

The C++ program registers ``sd_blocked::*`` (src/engine/blocked_operators.cpp): the
convolutions through oneDNN on activations in its blocked layout (a dense tensor
[N, C/block, H, W, block], block 16 with AVX-512, 8 with AVX2), GroupNorm+SiLU, the
residual add and the upsampling as fused kernels. A module calls them only when its int
attribute ``blocked`` is set (the block; 0 = its own plain code, the reference), which the
C++ program does at load after packing the module's convolution weights
(src/engine/stage_loader.h ``prepack_blocked``).

Here they get plain LibTorch definitions (on plain weights, blocked or plain activations)
so that ``torch.jit.script`` compiles the calls and Python can run them; loading
``libsd_engine.so`` first (``torch.ops.load_library``) gives Python the C++ kernels.
"""

from typing import Optional

import torch
import torch.nn.functional as F

_LIB = None


def plain(x: torch.Tensor, channels: int) -> torch.Tensor:
    """[N, C/b, H, W, b] -> [N, channels, H, W]; a 4-D tensor as it is."""
    if x.dim() != 5:
        return x
    n, cb, h, w, b = x.shape
    return x.permute(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :channels].contiguous()


def blocked(x: torch.Tensor, block: int) -> torch.Tensor:
    n, c, h, w = x.shape
    cb = (c + block - 1) // block
    if cb * block != c:
        x = F.pad(x, [0, 0, 0, 0, 0, cb * block - c])
    return x.reshape(n, cb, block, h, w).permute(0, 1, 3, 4, 2).contiguous()


def _finish(y: torch.Tensor, block: int, plain_out: bool) -> torch.Tensor:
    if plain_out or y.shape[1] % block != 0:
        return y
    return blocked(y, block)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def resblock(x, emb_out, norm1_w, norm1_b, eps1, conv1_w, conv1_b, norm2_w, norm2_b, eps2, conv2_w, conv2_b, skip_w,
             skip_b, groups, in_channels, out_channels, block, plain_out):
    x = plain(x, in_channels)
    h = F.conv2d(_silu(F.group_norm(x, groups, norm1_w, norm1_b, eps1)), conv1_w, conv1_b, padding=1)
    if emb_out is not None:
        h = h + emb_out[:, :, None, None]
    h = F.conv2d(_silu(F.group_norm(h, groups, norm2_w, norm2_b, eps2)), conv2_w, conv2_b, padding=1)
    skip = x if skip_w is None else F.conv2d(x, skip_w, skip_b)
    return _finish(skip + h, block, plain_out)


def upsample(x, w, b, channels, block, plain_out):
    x = F.interpolate(plain(x, channels), scale_factor=2.0, mode="nearest")
    return _finish(F.conv2d(x, w, b, padding=1), block, plain_out)


def downsample(x, w, b, channels, pad_begin, pad_end, block, plain_out):
    x = F.pad(plain(x, channels), [pad_begin, pad_end, pad_begin, pad_end])
    return _finish(F.conv2d(x, w, b, stride=2), block, plain_out)


def to_plain(x):
    if x.dim() != 5:
        return x
    return plain(x, x.shape[1] * x.shape[4])


def register():
    """Defines sd_blocked::* unless something (the C++ engine) already has."""
    global _LIB
    if _LIB is not None:
        return
    try:
        torch.ops.sd_blocked.resblock  # noqa: B018 - raises when the op is not defined
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("sd_blocked", "DEF")
    lib.define("resblock(Tensor x, Tensor? emb_out, Tensor norm1_w, Tensor norm1_b, float eps1, Tensor conv1_w, "
               "Tensor? conv1_b, Tensor norm2_w, Tensor norm2_b, float eps2, Tensor conv2_w, Tensor? conv2_b, "
               "Tensor? skip_w, Tensor? skip_b, int groups, int in_channels, int out_channels, int block, "
               "bool plain_out) -> Tensor")
    lib.define("upsample(Tensor x, Tensor w, Tensor? b, int channels, int block, bool plain_out) -> Tensor")
    lib.define("downsample(Tensor x, Tensor w, Tensor? b, int channels, int pad_begin, int pad_end, int block, "
               "bool plain_out) -> Tensor")
    lib.define("to_plain(Tensor x) -> Tensor")
    # CompositeImplicitAutograd: the one definition serves every device.
    for name, fn in (("resblock", resblock), ("upsample", upsample), ("downsample", downsample),
                     ("to_plain", to_plain)):
        lib.impl(name, fn, "CompositeImplicitAutograd")
    _LIB = lib


register()
