"""`--dtype q8_0`: the UNet's layers stored in 8-bit blocks (docs/model-format.md).

The layers are those the C++ program narrows for `--weights q8` (src/engine/q8_weights.cpp
narrow_to_q8): this package's Linear and Conv2d (they have `weight_scale`), whose output rows
are whole blocks of 32 values. Each weight becomes int8 values in its own shape and one fp16
scale per block of 32 along each row, [rows, row / 32]: GGUF's q8_0 blocks. Every other tensor
stays float32. The scales are written beside the weights as `LAYER.weight_scale`.

Floats are quantized with the C++ quantize_q8_0's arithmetic, step for step in float32, so an
export with `--dtype q8_0` holds what an fp32 export run with `--weights q8` narrows to. A q8_0
tensor of a GGUF source is copied as its blocks are (d and qs de-interleaved), not requantized.
"""

import numpy as np

BLOCK = 32


def narrowable_layers(module):
    """(name, layer) for each layer that takes 8-bit weights, as narrow_to_q8 chooses them."""
    import torch
    for name, layer in module.named_modules():
        w = getattr(layer, "weight", None)
        if not hasattr(layer, "weight_scale") or not isinstance(w, torch.Tensor) or not w.is_floating_point():
            continue
        if w.dim() >= 2 and w.shape[0] > 0 and (w.numel() // w.shape[0]) % BLOCK == 0:
            yield name, layer


def quantize_q8_0(w):
    """(int8 values in w's shape, fp16 scales [rows, row / 32]) as numpy arrays: per block,
    d = max|x| / 127, q = round(x * (1 / d)) rounding halves away from zero (std::round),
    all in float32, d stored as fp16 (round to nearest even); a block whose d is not a normal
    float is all zeros with d = 0."""
    import torch
    x = w.detach().to(torch.float32).contiguous().numpy().reshape(-1, BLOCK)
    scale = np.abs(x).max(axis=1) / np.float32(127)
    # A scale that is not a normal float (max|x| below ~1.5e-36) may have no float reciprocal
    # (1 / 7.9e-41 overflows): such a block is stored as zeros with d = 0, as in the C++ one.
    scale[scale < np.finfo(np.float32).tiny] = 0
    inv = np.zeros_like(scale)
    np.divide(np.float32(1), scale, out=inv, where=scale != 0)
    p = x * inv[:, None]
    # |p| + 0.5 is exact in float64 (p has a 24-bit significand and |p| <= 127.x).
    q = np.copysign(np.floor(np.abs(p).astype(np.float64) + 0.5), p)
    return q.astype(np.int8).reshape(tuple(w.shape)), scale.astype(np.float16).reshape(w.shape[0], -1)


def gguf_q8_0_blocks(ckpt, key):
    """The q8_0 blocks of checkpoint tensor `key` when it is one in a GGUF file (through the
    --vae / --unet-gguf overlays): (int8 [blocks, 32], fp16 [blocks]); else None."""
    from .checkpoints import file_of
    from .gguf_io import GgufFile
    f, k = file_of(ckpt, key)
    return f.q8_0_blocks(k) if isinstance(f, GgufFile) else None


QUANTIZED_GGUF_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def quantized_source(ckpt, module, kmap):
    """Whether any narrowable layer's weight comes from a quantized GGUF tensor (`--dtype
    auto`: the user chose 8 bits or fewer for the UNet, so the export keeps 8)."""
    from .checkpoints import file_of
    from .gguf_io import GgufFile
    for name, _ in narrowable_layers(module):
        ref = kmap.get(name + ".weight")
        if ref is None:
            continue
        f, k = file_of(ckpt, ref.key)
        if isinstance(f, GgufFile) and f.dtype_name(k) in QUANTIZED_GGUF_TYPES:
            return True
    return False


def source_blocks(ckpt, module, kmap):
    """Per layer name, the GGUF q8_0 blocks its weight was read from, in the layer's row order
    (a copy: the checkpoint is closed before the stage is written)."""
    out = {}
    for name, layer in narrowable_layers(module):
        ref = kmap.get(name + ".weight")
        if ref is None or ref.transpose:
            continue
        blocks = gguf_q8_0_blocks(ckpt, ref.key)
        if blocks is None:
            continue
        qs, d = blocks
        if ref.parts > 1:  # a slice of whole rows: a slice of whole blocks
            per = len(d) // ref.parts
            qs, d = qs[ref.part * per:(ref.part + 1) * per], d[ref.part * per:(ref.part + 1) * per]
        if qs.size != layer.weight.numel():
            continue
        out[name] = (qs.reshape(tuple(layer.weight.shape)).copy(), d.reshape(layer.weight.shape[0], -1).copy())
    return out


def narrow_module(module, blocks=None):
    """Makes every narrowable layer's weight int8 (from `blocks`, a source_blocks() result,
    where it has the layer, else quantized) and returns {LAYER.weight_scale: fp16 scales}."""
    import torch
    blocks = blocks or {}
    scales = {}
    for name, layer in list(narrowable_layers(module)):
        q, d = blocks[name] if name in blocks else quantize_q8_0(layer.weight)
        layer.weight = torch.nn.Parameter(torch.from_numpy(q), requires_grad=False)
        scales[(name + "." if name else "") + "weight_scale"] = torch.from_numpy(np.ascontiguousarray(d))
    return scales
