"""Our modules built from the sizes, then filled: with a checkpoint's weights through a key
map (every weight checked first: present, the right shape, a float type), or randomly."""

import math

from .checkpoints import file_of, load_finite
from .report import ExportError


class no_init:
    """Skip nn.Module weight initialisation: every weight is overwritten anyway, and not
    touching the freshly allocated memory keeps it from counting until it is replaced."""

    NAMES = ("kaiming_uniform_", "uniform_", "normal_", "ones_", "zeros_", "xavier_uniform_")

    def __enter__(self):
        import torch.nn.init as init
        self.saved = {n: getattr(init, n) for n in self.NAMES}
        for n in self.NAMES:
            setattr(init, n, lambda t, *a, **k: t)

    def __exit__(self, *exc):
        import torch.nn.init as init
        for n, f in self.saved.items():
            setattr(init, n, f)


def build_modules(unet_cfg, vae_cfg, text_cfg, text_cfg_2=None, vae_encoder=True):
    """The stages; SDXL (text_cfg_2 given) has a second text encoder with the pooled output.
    The VAE encoder comes last, so random weights of the others do not depend on it."""
    from .modules import TextEncoder, TextEncoderWithProjection, UNetModel, VAEDecoder, VAEEncoder
    with no_init():
        text = TextEncoder(text_cfg["vocab"], text_cfg["ctx"], text_cfg["width"], text_cfg["layers"],
                           text_cfg["heads"], text_cfg["hidden"], text_cfg["quick_gelu"], text_cfg["eps"])
        text.text_model.final_norm = text_cfg.get("final_norm", True)
        modules = {"text_encoder": text}
        if text_cfg_2 is not None:
            t = text_cfg_2
            modules["text_encoder_2"] = TextEncoderWithProjection(
                t["vocab"], t["ctx"], t["width"], t["layers"], t["heads"], t["hidden"], t["quick_gelu"], t["eps"],
                t.get("projection", t["width"]))
        modules["unet"] = UNetModel(**unet_cfg)
        modules["vae_decoder"] = VAEDecoder(**vae_cfg)
        if vae_encoder:
            modules["vae_encoder"] = VAEEncoder(**vae_cfg)
    return modules


def same_weight_shape(have, want):
    """Equal, or equal but for trailing size-1 dims (a 1x1 conv stored as a linear weight)."""
    def strip(s):
        s = list(s)
        while len(s) > 2 and s[-1] == 1:
            s.pop()
        return s
    return tuple(have) == tuple(want) or strip(have) == strip(want)


def check_keys(ckpt, modules, maps, hint):
    """Every weight present with the right shape and a float dtype, or one error naming them."""
    missing, wrong = [], []
    keys = set(ckpt.keys())
    for stage, kmap in maps.items():
        expected = modules[stage].state_dict()
        for mk, ref in kmap.items():
            want = tuple(expected[mk].shape)
            if ref.key not in keys:
                missing.append(ref.key)
            elif not same_weight_shape(ref.shape(ckpt), want):
                wrong.append(f"{ref.key} {list(ckpt.shape(ref.key))} (expected {list(want)}"
                             + (f" x {ref.parts}" if ref.parts > 1 else "") + ")")
            elif not ckpt.is_float(ref.key):
                wrong.append(f"{ref.key} has dtype {ckpt.dtype_name(ref.key)} (expected a float type)")

    def listing(items):
        shown = "; ".join(items[:4])
        return shown + (f"; ... ({len(items)} in all)" if len(items) > 4 else f" ({len(items)} in all)")

    problems = []
    if missing:
        problems.append("missing " + listing(missing))
    if wrong:
        problems.append("mismatched " + listing(wrong))
    if problems:
        raise ExportError(f"{ckpt.path} does not match the model {hint}: " + " | ".join(problems))


def check_in_range(t, ckpt, key):
    """A narrowed weight that became infinite (float16 ends at 65504) would make NaN or black
    pictures: refused in one line. The float32 sum is the cheap test, as in load_finite."""
    import math

    import torch
    if t.is_floating_point() and not math.isfinite(float(t.sum(dtype=torch.float32))):
        f, k = file_of(ckpt, key)
        raise ExportError(f"{f.path}: its tensor {k!r} holds values beyond {str(t.dtype).replace('torch.', '')}'s "
                          f"range; export with --dtype float32 or bfloat16")


def load_weights(ckpt, modules, maps, dtype=None):
    """Each weight converted once, straight to `dtype` (default float32): an fp16 export
    of an fp16 file never holds an fp32 copy of the model (SDXL: 7 instead of 14 GB)."""
    import torch
    dtype = dtype or torch.float32
    users = {}  # checkpoint key -> [(stage, module key, ref)]: in_proj feeds three weights
    for stage, kmap in maps.items():
        for mk, ref in kmap.items():
            users.setdefault(ref.key, []).append((stage, mk, ref))
    owners = {stage: dict(module.named_modules()) for stage, module in modules.items()}
    for key, uses in users.items():
        full = load_finite(ckpt, key)
        for stage, mk, ref in uses:
            owner_name, _, attr = mk.rpartition(".")
            param = getattr(owners[stage][owner_name], attr)
            t = full.chunk(ref.parts)[ref.part] if ref.parts > 1 else full
            if ref.transpose:
                t = t.t().contiguous()
            t = t.reshape(param.shape)
            if t.dtype != dtype:
                t = t.to(dtype)
                check_in_range(t, ckpt, key)
            elif ref.parts > 1 or not t.is_contiguous() or t.storage().size() != t.numel():
                t = t.clone()  # do not keep a larger shared storage alive
            param.data = t


def random_init(modules, seed, dtype=None):
    """Random weights for performance work: conv/linear N(0, 1/fan_in), zero biases,
    unit norm weights, CLIP-like embedding scales; drawn in fp32, each stored in `dtype`
    as it is made (the same values as converting the whole model afterwards)."""
    import torch
    from torch import nn
    dtype = dtype or torch.float32
    g = torch.Generator().manual_seed(seed)
    for stage in modules:
        for name, m in modules[stage].named_modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                w = torch.empty(m.weight.shape)
                w.normal_(0.0, 1.0 / math.sqrt(m.weight[0].numel()), generator=g)
                m.weight.data = w
                if m.bias is not None:
                    m.bias.data = torch.zeros(m.bias.shape)
            elif isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
                m.weight.data = torch.ones(m.weight.shape)
                m.bias.data = torch.zeros(m.bias.shape)
            elif isinstance(m, nn.Embedding):
                std = 0.01 if name.endswith("position_embedding") else 0.02
                m.weight.data = torch.empty(m.weight.shape).normal_(0.0, std, generator=g)
            for p in m.parameters(recurse=False):
                p.data = p.data.to(dtype)

