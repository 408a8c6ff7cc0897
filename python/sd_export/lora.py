"""LoRAs baked into an export (--lora FILE[:WEIGHT]): the same files, names and rule as
the C++ tool's run-time merge (src/io/lora_keys.cpp, src/engine/lora_merge.cpp):
kohya / A1111 files (lora_unet_* / lora_te_*, SDXL's lora_te1_* / lora_te2_*, lora_down /
lora_up / alpha, LoCon) and diffusers' pre-PEFT files (unet.*.lora.{down,up}.weight,
text_encoder.*.lora_linear_layer.*, SDXL's text_encoder_2.*),
W' = W + m * (alpha / rank) * (up.flatten(1) @ down.flatten(1)).reshape(W.shape) in fp32,
several files stacked in order. Errors are one line (ExportError)."""

import hashlib
import math
import os
import re

from .report import ExportError
from .safetensors_io import SafetensorsFile

SUFFIXES = ((".lora_down.weight", "down"), (".lora_up.weight", "up"), (".lora.down.weight", "down"),
            (".lora.up.weight", "up"), (".lora_linear_layer.down.weight", "down"),
            (".lora_linear_layer.up.weight", "up"), (".alpha", "alpha"))
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
        if ".hada_" in k or ".lokr_" in k:
            raise ExportError(f"LoRA file {path} is a LyCORIS LoHa/LoKr file ({k}), which the export does not "
                              "bake in; give it to sd-txt2img --lora, which applies it at load")
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


def read_lora(path, table, modules):
    """[(key, stage, parameter name, parameter, down, up, scale)] of one file, checked against the model."""
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
            unbuilt = _unbuilt_layer(module, table, modules) if module not in table else None
            if (module not in table and unbuilt is None) or "down" not in p or "up" not in p:
                unknown.append(module)
                continue
            stage, name, param = unbuilt or table[module]
            down, up = f.load(p["down"]).float(), f.load(p["up"]).float()
            for key, t in ((p["down"], down), (p["up"], up)):
                if not torch.isfinite(t).all():
                    raise ExportError(f"LoRA file {path}: its tensor {key!r} holds NaN or infinite values")
            _check_fit(path, module, stage, name, tuple(param.shape), tuple(down.shape), tuple(up.shape))
            rank = down.shape[0]
            alpha = float(f.load(p["alpha"]).float().reshape(-1)[0]) if "alpha" in p else float(rank)
            if not math.isfinite(alpha):
                raise ExportError(f"LoRA file {path} has an alpha that is not a finite number: {module!r}")
            if unbuilt is None:  # a layer not built: checked, nothing to change
                out.append((module, stage, name, param, down, up, alpha / rank))
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


def bake_loras(modules, loras):
    """Merges each (path, weight) into the modules' fp32 weights, in order; returns what model.json records."""
    import torch
    table = target_table(modules)
    record = []
    with torch.no_grad():
        for path, weight in loras:
            for _key, _stage, _name, param, down, up, scale in read_lora(path, table, modules):
                delta = (up.flatten(1) @ down.flatten(1)).reshape(param.shape) * scale
                param.copy_(param.float() + weight * delta)
            name = re.sub(r"\.safetensors$", "", os.path.basename(path))
            record.append({"name": name, "weight": weight, "hash": short_hash(path)})
    return record
