"""LoRAs baked into an export (--lora FILE[:WEIGHT]): the same files, names and rule as
the C++ tool's run-time merge (src/io/lora_keys.cpp, src/engine/lora_merge.cpp):
kohya / A1111 files (lora_unet_* / lora_te_*, SDXL's lora_te1_* / lora_te2_*, lora_down /
lora_up / alpha, LoCon, LyCORIS's lora_mid, LoHa and LoKr under those names) and diffusers'
pre-PEFT files (unet.*.lora.{down,up}.weight, text_encoder.*.lora_linear_layer.*, SDXL's
text_encoder_2.*), W' = W + m * (alpha / rank) * (up.flatten(1) @ down.flatten(1)).reshape(W.shape)
(or a LoHa's or LoKr's product, src/io/lora_keys.h; a DoRA magnitude rescales the merged weight) in
fp32, several files stacked in order.
Errors are one line (ExportError)."""

import hashlib
import math
import os
import re

from .report import ExportError
from .safetensors_io import SafetensorsFile

LYCORIS_PARTS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2", "lokr_w1", "lokr_w1_a",
                 "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2")
SUFFIXES = ((".lora_down.weight", "down"), (".lora_up.weight", "up"), (".lora_mid.weight", "mid"),
            (".lora.down.weight", "down"), (".lora.up.weight", "up"), (".lora_linear_layer.down.weight", "down"),
            (".lora_linear_layer.up.weight", "up"), (".alpha", "alpha"),
            (".dora_scale", "dora_scale")) + tuple(("." + p, p) for p in LYCORIS_PARTS)
RESNET_PARTS = {"in_layers.0": "norm1", "in_layers.2": "conv1", "out_layers.0": "norm2", "out_layers.3": "conv2",
                "emb_layers.1": "time_emb_proj", "skip_connection": "conv_shortcut"}
TOP = {"time_embed.0": "time_embedding.linear_1", "time_embed.2": "time_embedding.linear_2",
       "input_blocks.0.0": "conv_in", "out.0": "conv_norm_out", "out.2": "conv_out"}
PROCESSOR = {".processor.to_q_lora": ".to_q", ".processor.to_k_lora": ".to_k", ".processor.to_v_lora": ".to_v",
             ".processor.to_out_lora": ".to_out.0"}


# As the CLI (src/text/lora_tags.cpp): weights in use lie within about -2..2; past
# +-100 a LoRA is noise, and 1e300 overflows the fp32 weights it is baked into.
MAX_WEIGHT = 100.0


def parse_lora_arg(text):
    """'FILE[:WEIGHT]' -> (path, weight): a trailing ':number' is the weight, finite and within +-100."""
    path, weight = text, 1.0
    head, sep, tail = text.rpartition(":")
    if sep:
        try:
            weight, path = float(tail), head
        except ValueError:
            pass
    if not path:
        raise ExportError(f"--lora '{text}' names no file (--lora FILE[:WEIGHT])")
    if math.isnan(weight):
        raise ExportError(f"--lora {text}: the weight '{tail}' is not a number (NaN) (--lora FILE[:WEIGHT])")
    if not abs(weight) <= MAX_WEIGHT:
        raise ExportError(f"--lora {text}: the weight '{tail}' is outside -{MAX_WEIGHT:g} .. {MAX_WEIGHT:g} "
                          "(--lora FILE[:WEIGHT])")
    return path, weight


def _block(base, j, k, rest):
    if k == 0:
        part = RESNET_PARTS.get(rest)
        return f"{base}.resnets.{j}.{part}" if part else None
    return f"{base}.attentions.{j}.{rest}" if rest else None


def diffusers_unet_module(compvis):
    """CompVis UNet module -> diffusers module path (two ResBlocks a down level, three an up level)."""
    if compvis in TOP:
        return TOP[compvis]
    t = compvis.split(".")
    if len(t) < 3 or not t[1].isdigit():
        return None
    n = int(t[1])
    if t[0] == "middle_block":
        rest = ".".join(t[2:])
        if n == 1:
            return "mid_block.attentions.0." + rest
        part = RESNET_PARTS.get(rest)
        return f"mid_block.resnets.{n // 2}.{part}" if n in (0, 2) and part else None
    if not t[2].isdigit():
        return None
    k, rest = int(t[2]), ".".join(t[3:])
    if t[0] == "input_blocks" and n >= 1:
        level, j = (n - 1) // 3, (n - 1) % 3
        if j == 2:
            return f"down_blocks.{level}.downsamplers.0.conv" if k == 0 and rest == "op" else None
        return _block(f"down_blocks.{level}", j, k, rest) if k <= 1 else None
    if t[0] == "output_blocks":
        level, j = n // 3, n % 3
        if j == 2 and k >= 1 and rest == "conv":
            return f"up_blocks.{level}.upsamplers.0.conv"
        return _block(f"up_blocks.{level}", j, k, rest) if k <= 1 else None
    return None


def target_table(modules):
    """Every name a LoRA may give a module -> (stage, parameter name, parameter)."""
    table = {}
    for name, p in modules["unet"].named_parameters():
        if not name.endswith(".weight"):
            continue
        compvis = name[:-7]
        table.setdefault("lora_unet_" + compvis.replace(".", "_"), ("unet", name, p))
        diffusers = diffusers_unet_module(compvis)
        if diffusers:
            table.setdefault("lora_unet_" + diffusers.replace(".", "_"), ("unet", name, p))
            table.setdefault("unet." + diffusers, ("unet", name, p))
    # SDXL (a second text encoder; HF names in both): lora_te1_ / lora_te2_, else lora_te_.
    sdxl = "text_encoder_2" in modules
    stages = [("text_encoder", "lora_te1_" if sdxl else "lora_te_")]
    if sdxl:
        stages.append(("text_encoder_2", "lora_te2_"))
    for stage, kohya in stages:
        for name, p in modules[stage].named_parameters():
            if name.endswith(".weight"):
                table.setdefault(kohya + name[:-7].replace(".", "_"), (stage, name, p))
                table.setdefault(f"{stage}." + name[:-7], (stage, name, p))
    return table


def _built_layers(module):
    return len(module.text_model.encoder.layers)


def _unbuilt_layer(name, table, modules):
    """SD 2.x's and SDXL's first text encoder are exported without their last layer, whose
    output no picture uses: a LoRA module of such a layer changes nothing. Its layer-0
    twin (for the shape check) when `name` is one, else None."""
    m = re.search(r"(text_model_encoder_layers_|text_model\.encoder\.layers\.)(\d+)", name)
    if not m:
        return None
    twin = table.get(name[:m.start(2)] + "0" + name[m.end(2):])
    if twin is None or int(m.group(2)) < _built_layers(modules[twin[0]]):
        return None
    return twin


def _refuse_other_layouts(path, keys, sdxl):
    for k in keys:
        if not sdxl and k.startswith(("lora_te1_", "lora_te2_")):
            raise ExportError(f"LoRA file {path} is a LoRA for SDXL ({k}); this model is SD 1.x or 2.x")
        if sdxl and k.startswith("lora_te_"):
            raise ExportError(f"LoRA file {path} is a LoRA for SD 1.x or 2.x ({k}); this model is SDXL")
        if k.endswith((".lora_A.weight", ".lora_B.weight")):
            raise ExportError(f"LoRA file {path} is in the PEFT format ({k}), which is not supported")
        # wd_for_diff: a newer LyCORIS DoRA that rescales the change alone, not the merged weight.
        if k.endswith((".oft_blocks", ".oft_diag", ".on_input", ".w_norm", ".a1.weight", ".diff", ".wd_for_diff")):
            raise ExportError(f"LoRA file {path} is a LyCORIS file of a kind this tool does not apply ({k}); LoRA, "
                              "LoCon, LoHa and LoKr files are supported")
        if k.startswith("lora_te_") and "resblocks" in k:
            raise ExportError(f"LoRA file {path} has an open_clip text-encoder layout ({k}); a LoRA for another model?")


def _kind(shape):
    return "a linear layer" if len(shape) == 2 else f"{shape[2]}x{shape[3]} conv" if len(shape) == 4 else \
        f"a {len(shape)}-d tensor"


def _check_fit(path, key, stage, param, w, down, up):
    where = f"LoRA file {path} does not fit this model: {key}"
    if len(w) not in (2, 4):
        raise ExportError(f"{where} changes {stage} {param}, which is not a linear or conv layer")
    if len(down) != len(w) or len(up) != len(w):
        raise ExportError(f"{where} is {_kind(down)} there, {stage} {param} is {_kind(w)} here "
                          "(a LoRA for another model?)")
    rank = down[0]
    fits = up[1] == rank and up[0] == w[0] and down[1] == w[1]
    if len(w) == 4:
        fits = fits and tuple(down[2:]) == tuple(w[2:]) and tuple(up[2:]) == (1, 1)
    if not fits:
        raise ExportError(f"{where} has down {list(down)} and up {list(up)}, {stage} {param} is {list(w)} "
                          "(a LoRA for another model or size?)")


def _module_kind(parts):
    """'lora', 'loha' or 'lokr' for a complete set of a module's parts (as lora_keys.cpp), else None."""
    n = set(parts) - {"alpha", "dora_scale"}  # these two go with any kind
    if n and all(p.startswith("hada_") for p in n):
        return "loha" if {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"} <= n else None
    if n and all(p.startswith("lokr_") for p in n):
        w1 = ("lokr_w1" in n) != ({"lokr_w1_a", "lokr_w1_b"} <= n)
        w2 = ("lokr_w2" in n) != ({"lokr_w2_a", "lokr_w2_b"} <= n)
        stray = (("lokr_w1" in n and n & {"lokr_w1_a", "lokr_w1_b"})
                 or ("lokr_w2" in n and n & {"lokr_w2_a", "lokr_w2_b"})
                 or ("lokr_t2" in n and not {"lokr_w2_a", "lokr_w2_b"} <= n)
                 or ("lokr_w1_a" in n) != ("lokr_w1_b" in n) or ("lokr_w2_a" in n) != ("lokr_w2_b" in n))
        return "lokr" if w1 and w2 and not stray else None
    return "lora" if {"down", "up"} <= n <= {"down", "up", "mid"} else None


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _rebuilt(a, b, t):
    """The shape a @ b.flatten(1) makes, or with t [i, j, kh, kw] the CP product of a [i, out], b [j, in]."""
    if t is not None:
        ok = len(t) == 4 and len(a) == 2 and len(b) == 2 and a[0] == t[0] and b[0] == t[1]
        return (a[1], b[1], t[2], t[3]) if ok else None
    return (a[0], _prod(b[1:])) if len(a) == 2 and len(b) >= 2 and a[1] == b[0] else None


def _fills(r, w):
    return r is not None and (tuple(r) == tuple(w) or (len(r) == 2 and r[0] == w[0] and r[1] == _prod(w[1:])))


def _lycoris_fits(kind, s, w):
    """Whether a LoCon-with-mid, LoHa or LoKr module of these part shapes makes a change of W's shape."""
    g = s.get
    if kind == "lora":
        d, u, t = s["down"], s["up"], s["mid"]
        one = all(len(x) == 2 or (len(x) == 4 and tuple(x[2:]) == (1, 1)) for x in (d, u))
        return one and len(t) == 4 and t[0] == u[1] and t[1] == d[0] and (u[0], d[1], t[2], t[3]) == tuple(w)
    if kind == "loha":
        return (_fills(_rebuilt(s["hada_w1_a"], s["hada_w1_b"], g("hada_t1")), w)
                and _fills(_rebuilt(s["hada_w2_a"], s["hada_w2_b"], g("hada_t2")), w))
    w1 = s["lokr_w1"] if "lokr_w1" in s else _rebuilt(s["lokr_w1_a"], s["lokr_w1_b"], None)
    w2 = s["lokr_w2"] if "lokr_w2" in s else _rebuilt(s["lokr_w2_a"], s["lokr_w2_b"], g("lokr_t2"))
    if w1 is None or w2 is None or len(w1) != 2 or len(w2) not in (2, 4):
        return False
    k = (w1[0] * w2[0], w1[1] * w2[1]) + tuple(w2[2:])
    return k == tuple(w) if len(k) == 4 else _fills(k, w)


def _rank(kind, s):
    """What alpha is divided by (0: none, scale 1), as A1111's network modules take it."""
    if kind == "lora":
        return s["down"][0]
    if kind == "loha":
        return s["hada_w1_b"][0]
    return s["lokr_w2_b"][0] if "lokr_w2_b" in s else s["lokr_w1_b"][0] if "lokr_w1_b" in s else 0


def dora_shape(w, axis):
    """The shape of a DoRA magnitude along `axis` of a weight of shape w: [out, 1, ...] or [1, in, 1, ...]."""
    return tuple(w[i] if i == axis else 1 for i in range(len(w)))


def dora_axis(s, w):
    """0 (one magnitude per output row) or 1 (per input column) for a dora_scale of shape s, else None."""
    return next((axis for axis in (0, 1) if len(w) >= 2 and tuple(s) == dora_shape(w, axis)), None)


def _cp(t, a, b):
    import torch
    return torch.einsum("ijkl,ip,jr->prkl", t, a, b)


def _factor(p, a, b, t):
    return _cp(p[t], p[a], p[b]) if t in p else p[a].flatten(1) @ p[b].flatten(1)


def delta(kind, p, shape):
    """A module's change before its scale, reshaped to the parameter's shape (fp32 parts by name)."""
    import torch
    if kind == "lora":
        d = (_cp(p["mid"], p["up"].flatten(1).t(), p["down"].flatten(1)) if "mid" in p
             else p["up"].flatten(1) @ p["down"].flatten(1))
    elif kind == "loha":
        d = (_factor(p, "hada_w1_a", "hada_w1_b", "hada_t1").reshape(shape)
             * _factor(p, "hada_w2_a", "hada_w2_b", "hada_t2").reshape(shape))
    else:
        w1 = p["lokr_w1"] if "lokr_w1" in p else p["lokr_w1_a"] @ p["lokr_w1_b"]
        w2 = p["lokr_w2"] if "lokr_w2" in p else _factor(p, "lokr_w2_a", "lokr_w2_b", "lokr_t2")
        if w2.dim() == 4:
            w1 = w1[:, :, None, None]
        d = torch.kron(w1, w2.contiguous())
    return d.reshape(shape)


def merge(w, kind, p, scale, weight):
    """W + m * scale * D, or with a DoRA magnitude W + m * (decompose(W + scale * D) - W): the merged
    weight rescaled so that its norm along the magnitude's axis is dora_scale (LyCORIS's rule, fp32's
    epsilon added to the norm; the multiplier as ComfyUI applies it)."""
    import torch
    d = delta(kind, p, w.shape) * scale
    if "dora_scale" not in p:
        return w + weight * d
    merged = w + d
    axis = dora_axis(p["dora_scale"].shape, w.shape)
    others = [i for i in range(w.dim()) if i != axis]
    norm = torch.linalg.vector_norm(merged, 2, dim=others, keepdim=True) + torch.finfo(torch.float32).eps
    return w + weight * (merged * (p["dora_scale"] / norm) - w)


def read_lora(path, table, modules):
    """[(key, stage, parameter name, parameter, kind, parts, scale)] of one file, checked against the model."""
    import torch
    if not os.path.isfile(path):
        raise ExportError(f"LoRA file {path} does not exist")
    with SafetensorsFile(path) as f:
        keys = list(f.keys())
        if not keys:
            raise ExportError(f"LoRA file {path} holds no tensors")
        _refuse_other_layouts(path, keys, "text_encoder_2" in modules)
        parts, unknown = {}, []
        for k in keys:
            for suffix, part in SUFFIXES:
                if k.endswith(suffix):
                    module = k[:-len(suffix)]
                    for old, new in PROCESSOR.items():
                        if module.endswith(old):
                            module = module[:-len(old)] + new
                    parts.setdefault(module, {})[part] = k
                    break
            else:
                unknown.append(k)
        out = []
        for module in sorted(parts):
            p = parts[module]
            kind = _module_kind(p)
            unbuilt = _unbuilt_layer(module, table, modules) if module not in table else None
            if (module not in table and unbuilt is None) or kind is None:
                unknown.append(module)
                continue
            stage, name, param = unbuilt or table[module]
            shapes = {part: tuple(f.shape(k)) for part, k in p.items() if part != "alpha"}
            for part, s in shapes.items():
                if len(s) < 2 or 0 in s:
                    raise ExportError(f"LoRA file {path} has a tensor that is empty or not a matrix: {p[part]!r} "
                                      f"{list(s)}")
            w = tuple(param.shape)
            if "dora_scale" in shapes and dora_axis(shapes["dora_scale"], w) is None:
                raise ExportError(f"LoRA file {path} does not fit this model: {module} has a DoRA magnitude "
                                  f"dora_scale {list(shapes['dora_scale'])}; {stage} {name} is {list(w)} here, which "
                                  f"needs one per output {list(dora_shape(w, 0))} or per input "
                                  f"{list(dora_shape(w, 1))}")
            if kind == "lora" and "mid" not in p:
                _check_fit(path, module, stage, name, tuple(param.shape), shapes["down"], shapes["up"])
            elif not _lycoris_fits(kind, shapes, tuple(param.shape)):
                listed = ", ".join(f"{k} {list(s)}" for k, s in sorted(shapes.items()))
                raise ExportError(f"LoRA file {path} does not fit this model: {module} ({listed}); {stage} {name} is "
                                  f"{list(param.shape)} (a LoRA for another model or size?)")
            tensors = {}
            for part, key in p.items():
                if part == "alpha":
                    continue
                tensors[part] = f.load(key).float()
                if not torch.isfinite(tensors[part]).all():
                    raise ExportError(f"LoRA file {path}: its tensor {key!r} holds NaN or infinite values")
            rank = _rank(kind, shapes)
            alpha = float(f.load(p["alpha"]).float().reshape(-1)[0]) if "alpha" in p else float(rank)
            if not math.isfinite(alpha):
                raise ExportError(f"LoRA file {path} has an alpha that is not a finite number: {module!r}")
            if unbuilt is None:  # a layer not built: checked, nothing to change
                out.append((module, stage, name, param, kind, tensors, alpha / rank if rank else 1.0))
    if unknown:
        listed = ", ".join(unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise ExportError(f"LoRA file {path} has {len(unknown)} key{'s' if len(unknown) > 1 else ''} that match no "
                          f"layer of this model: {listed} (a LoRA for another model, or a layout this tool "
                          f"does not know)")
    return out


def short_hash(path):
    """AUTOMATIC1111's LoRA hash: SHA-256 of the data after the header, 12 hex digits."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        f.seek(8 + n)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:12]


def bake_loras(modules, loras, dtype=None):
    """Merges each (path, weight) into the modules' fp32 weights, in order; returns what model.json records.
    A merged weight past fp32's range, or past fp16's when the export is `dtype` float16, is refused naming
    the file (it would be Inf in the export, and NaN pictures)."""
    import torch
    table = target_table(modules)
    record = []
    changed = {}  # (stage, name) -> (param, the last file that changed it)
    with torch.no_grad():
        for path, weight in loras:
            for key, stage, name, param, kind, tensors, scale in read_lora(path, table, modules):
                param.copy_(merge(param.float(), kind, tensors, scale, weight))
                if not torch.isfinite(param).all():
                    raise ExportError(f"LoRA file {path}: merging {key} at weight {weight:g} into {stage} {name} gives "
                                      "values beyond fp32's range (its tensors or the weight are far too large)")
                changed[(stage, name)] = (param, path)
            name = re.sub(r"\.safetensors$", "", os.path.basename(path))
            record.append({"name": name, "weight": weight, "hash": short_hash(path)})
        if dtype == torch.float16:
            for (stage, name), (param, path) in changed.items():
                if not torch.isfinite(param.half()).all():
                    raise ExportError(f"LoRA file {path}: the merged {stage} {name} holds values beyond fp16's range "
                                      f"(largest {float(param.abs().max()):g}); export with --dtype float32 or lower "
                                      "the LoRA's weight")
    return record
