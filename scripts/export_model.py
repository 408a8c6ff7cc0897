#!/usr/bin/python3
"""Export a Stable Diffusion 1.x or 2.x model to the model directory the C++ program reads.

    export_model.py CHECKPOINT --out DIR [--config LDM.yaml] [--text-config TEXT.json]
                    [--tokenizer DIR] [--dtype float32|float16] [--parameterization eps|v]
    export_model.py --random-init --out DIR [--seed N] [--config ...] [--text-config ...]

CHECKPOINT is a single-file CompVis / Stability-AI checkpoint (`.safetensors` or `.ckpt`)
or a diffusers folder (model_index.json, unet/, vae/, text_encoder/, tokenizer/,
scheduler/).  SD 1.x and SD 2.x are told apart by their keys (`cond_stage_model.transformer.*`:
CLIP ViT-L text encoder; `cond_stage_model.model.*`: OpenCLIP ViT-H text tower) and
shapes, or by the LDM config when given.  DIR receives text_encoder.pt, unet.pt,
vae_decoder.pt (TorchScript), vocab.json, merges.txt and model.json; the format is
described in docs/model-format.md.  Every failure prints one line
`export_model.py: error: ...` and exits with status 1.
"""

import argparse
import json
import math
import os
import re
import shutil
import struct
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "models"))

import diffusers_layout  # noqa: E402  (no torch inside)

PROG = "export_model.py"

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_PREFIX = "cond_stage_model.transformer."
SD2_TEXT_PREFIX = "cond_stage_model.model."
# Key prefixes of a diffusers folder's three weight files, once read as one checkpoint.
DIFFUSERS_PARTS = {"unet": "unet/", "vae": "vae/", "text_encoder": "text_encoder/"}


class ExportError(Exception):
    """A failure to report as one line, without a traceback."""


def say(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- configuration

# configs/stable-diffusion/v1-inference.yaml
SD1_UNET = dict(in_channels=4, out_channels=4, model_channels=320, attention_resolutions=[4, 2, 1],
                num_res_blocks=2, channel_mult=[1, 2, 4, 4], num_heads=8, num_head_channels=-1,
                transformer_depth=1, context_dim=768, use_linear_in_transformer=False)
SD1_VAE = dict(embed_dim=4, ch=128, out_ch=3, ch_mult=[1, 2, 4, 4], num_res_blocks=2, attn_resolutions=[],
               resolution=256, z_channels=4)
SD1_SCHEDULE = dict(linear_start=0.00085, linear_end=0.012, timesteps=1000, scale_factor=0.18215,
                    parameterization="eps")
# CLIP ViT-L/14 text transformer
SD1_TEXT = dict(vocab=49408, ctx=77, width=768, layers=12, heads=12, hidden=3072, quick_gelu=True, eps=1e-5,
                bos_id=49406, eos_id=49407, pad_id=49407, layers_total=12)
# Stability-AI configs/stable-diffusion/v2-inference(-v).yaml: same VAE and schedule.
SD2_UNET = dict(SD1_UNET, num_heads=-1, num_head_channels=64, context_dim=1024, use_linear_in_transformer=True)
# OpenCLIP ViT-H/14 text tower, "penultimate" layer: 23 of its 24 layers run.
SD2_TEXT = dict(vocab=49408, ctx=77, width=1024, layers=23, heads=16, hidden=4096, quick_gelu=False, eps=1e-5,
                bos_id=49406, eos_id=49407, pad_id=0, layers_total=24)
# Heads of the OpenCLIP text towers by width (head size 64), for checkpoints without a text config.
OPEN_CLIP_HEADS = {512: 8, 768: 12, 1024: 16, 1280: 20}

FAMILY_DEFAULTS = {"sd1": (SD1_UNET, SD1_TEXT), "sd2": (SD2_UNET, SD2_TEXT)}


def load_ldm_config(path):
    """Settings from a v1-inference.yaml / v2-inference(-v).yaml-style LDM config:
    {"family", "unet", "vae", "schedule", "text_layer"}."""
    import yaml
    try:
        with open(path, "r", encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
    except OSError as e:
        raise ExportError(f"cannot read config {path}: {e.strerror or e}")
    except yaml.YAMLError as e:
        raise ExportError(f"config {path} is not valid YAML: {one_line(e)}")
    try:
        params = cfg["model"]["params"]
        unet_params = params["unet_config"]["params"]
        first_stage = params["first_stage_config"]["params"]
        dd = first_stage["ddconfig"]
    except (KeyError, TypeError):
        raise ExportError(f"config {path} is not an LDM config (expected model.params.unet_config and "
                          f"model.params.first_stage_config.params.ddconfig)")

    cond = params.get("cond_stage_config") or {}
    cond_target = str(cond.get("target", ""))
    if "OpenCLIP" in cond_target:
        family = "sd2"
    elif "FrozenCLIPEmbedder" in cond_target or not cond_target:
        family = "sd1"
    else:
        raise ExportError(f"config {path}: unsupported text encoder {cond_target} (expected FrozenCLIPEmbedder "
                          f"or FrozenOpenCLIPEmbedder)")
    text_layer = str((cond.get("params") or {}).get("layer", "last" if family == "sd1" else "penultimate"))
    if text_layer not in ("last", "penultimate"):
        raise ExportError(f"config {path}: unsupported text encoder layer {text_layer!r} (last or penultimate)")
    # use_fp16 only says which dtype the original ran under autocast; the weights are the same.
    unsupported = [k for k in ("use_scale_shift_norm", "resblock_updown", "num_classes", "adm_in_channels",
                               "disable_self_attentions", "num_attention_blocks") if unet_params.get(k)]
    if unet_params.get("dims", 2) != 2 or not unet_params.get("use_spatial_transformer", False) \
            or not unet_params.get("conv_resample", True):
        unsupported.append("dims/use_spatial_transformer/conv_resample")
    if unsupported:
        raise ExportError(f"config {path}: unsupported UNet options: {', '.join(unsupported)}")

    try:
        depth = unet_params.get("transformer_depth", 1)
        if not isinstance(depth, int):
            raise ExportError(f"config {path}: per-level transformer_depth is not supported")
        unet = dict(
            in_channels=int(unet_params["in_channels"]),
            out_channels=int(unet_params["out_channels"]),
            model_channels=int(unet_params["model_channels"]),
            attention_resolutions=[int(r) for r in unet_params["attention_resolutions"]],
            num_res_blocks=int(unet_params["num_res_blocks"]),
            channel_mult=[int(m) for m in unet_params["channel_mult"]],
            num_heads=int(unet_params.get("num_heads", -1)),
            num_head_channels=int(unet_params.get("num_head_channels", -1)),
            transformer_depth=depth,
            context_dim=int(unet_params["context_dim"]),
            use_linear_in_transformer=bool(unet_params.get("use_linear_in_transformer", False)),
        )
        vae = dict(
            embed_dim=int(first_stage["embed_dim"]),
            ch=int(dd["ch"]),
            out_ch=int(dd["out_ch"]),
            ch_mult=[int(m) for m in dd["ch_mult"]],
            num_res_blocks=int(dd["num_res_blocks"]),
            attn_resolutions=[int(r) for r in dd.get("attn_resolutions", [])],
            resolution=int(dd["resolution"]),
            z_channels=int(dd["z_channels"]),
        )
        schedule = dict(
            linear_start=float(params.get("linear_start", 0.0001)),
            linear_end=float(params.get("linear_end", 0.02)),
            timesteps=int(params.get("timesteps", 1000)),
            scale_factor=float(params.get("scale_factor", 1.0)),
            parameterization=str(params.get("parameterization", "eps")),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"config {path}: missing or invalid UNet/VAE setting ({one_line(e)})")
    if unet["num_heads"] == -1 and unet["num_head_channels"] == -1:
        raise ExportError(f"config {path}: UNet needs num_heads or num_head_channels")
    if schedule["parameterization"] not in ("eps", "v"):
        raise ExportError(f"config {path}: unknown parameterization {schedule['parameterization']!r}")
    # The latent size the model was trained at (SD 1.x: 64, i.e. 512x512 pictures): the CLI's
    # default picture size for this model.
    latent_size = params.get("image_size")
    latent_size = latent_size if isinstance(latent_size, int) and latent_size > 0 else None
    return {"family": family, "unet": unet, "vae": vae, "schedule": schedule, "text_layer": text_layer,
            "latent_size": latent_size}


def load_text_config(path):
    """Text transformer sizes: our text_encoder.json (vocab/ctx/width/layers/heads[, layers_used,
    hf_config]) or a plain HF CLIPTextConfig json.  "layers" counts the layers in the
    checkpoint, "layers_used" those SD runs (SD 2.x: the penultimate layer's output)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            cfg = json.load(f)
    except OSError as e:
        raise ExportError(f"cannot read text config {path}: {e.strerror or e}")
    except ValueError as e:
        raise ExportError(f"text config {path} is not valid JSON: {one_line(e)}")
    if not isinstance(cfg, dict):
        raise ExportError(f"text config {path} is not a JSON object")
    hf = None
    for key in ("hf_config", "hf_config_equivalent"):
        if isinstance(cfg.get(key), dict):
            hf = cfg[key]
    if hf is None and "hidden_size" in cfg:
        hf = cfg
    try:
        if "width" in cfg:
            text = dict(vocab=int(cfg["vocab"]), ctx=int(cfg["ctx"]), width=int(cfg["width"]),
                        layers=int(cfg["layers"]), heads=int(cfg["heads"]))
        else:
            text = dict(vocab=int(hf["vocab_size"]), ctx=int(hf["max_position_embeddings"]),
                        width=int(hf["hidden_size"]), layers=int(hf["num_hidden_layers"]),
                        heads=int(hf["num_attention_heads"]))
        hf = hf or {}
        text["hidden"] = int(cfg.get("mlp") or hf.get("intermediate_size", 4 * text["width"]))
        act = hf.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise ExportError(f"text config {path}: unsupported hidden_act {act!r}")
        text["quick_gelu"] = act == "quick_gelu"
        text["eps"] = float(cfg.get("layer_norm_eps", hf.get("layer_norm_eps", 1e-5)))
        text["bos_id"] = int(cfg.get("bos_token_id", hf.get("bos_token_id", 49406)))
        text["eos_id"] = int(cfg.get("eos_token_id", hf.get("eos_token_id", 49407)))
        text["pad_id"] = int(cfg.get("pad_token_id", hf.get("pad_token_id", text["eos_id"])))
        text["layers_total"] = text["layers"]
        if "layers_used" in cfg:
            text["layers"] = int(cfg["layers_used"])
        elif cfg.get("layer") == "penultimate":
            text["layers"] -= 1
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"text config {path}: missing or invalid field ({one_line(e)})")
    if text["width"] % text["heads"]:
        raise ExportError(f"text config {path}: width {text['width']} is not a multiple of heads {text['heads']}")
    if not 1 <= text["layers"] <= text["layers_total"]:
        raise ExportError(f"text config {path}: layers_used must be between 1 and {text['layers_total']}")
    return text


def alphas_cumprod(schedule):
    """ldm register_schedule ('linear'): float64 math, then the float32 buffer values."""
    import numpy as np
    betas = np.linspace(schedule["linear_start"] ** 0.5, schedule["linear_end"] ** 0.5, schedule["timesteps"],
                        dtype=np.float64) ** 2
    return np.cumprod(1.0 - betas, axis=0).astype(np.float32)


# --------------------------------------------------------------------------- checkpoint readers

def one_line(e):
    text = str(e).strip() or type(e).__name__
    # torch's weights_only failures put the useful part after a long preamble
    marker = "WeightsUnpickler error: "
    if marker in text:
        text = text[text.index(marker) + len(marker):]
    return text.splitlines()[0].strip()


SAFETENSORS_DTYPES = {
    # name: (numpy dtype name, bytes per element, torch dtype name or None if only shape-checked)
    "F64": ("<f8", 8, "float64"), "F32": ("<f4", 4, "float32"), "F16": ("<f2", 2, "float16"),
    "BF16": ("<u2", 2, "bfloat16"),
    "I64": ("<i8", 8, None), "I32": ("<i4", 4, None), "I16": ("<i2", 2, None), "I8": ("i1", 1, None),
    "U8": ("u1", 1, None), "BOOL": ("?", 1, None),
}


class SafetensorsFile:
    """Reads a .safetensors file lazily: the header up front, each tensor when asked for."""

    MAX_HEADER = 100 * 1024 * 1024

    def __init__(self, path):
        self.path = path
        try:
            self.file = open(path, "rb")
        except OSError as e:
            raise ExportError(f"cannot open {path}: {e.strerror or e}")
        size = os.fstat(self.file.fileno()).st_size
        head = self.file.read(8)
        if len(head) < 8:
            raise ExportError(f"{path} is not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            raise ExportError(f"{path} is truncated or not a safetensors file "
                              f"(header length {header_len} but the file has {size} bytes)")
        if header_len > self.MAX_HEADER:
            raise ExportError(f"{path} is not a safetensors file (header length {header_len} is implausible)")
        raw = self.file.read(header_len)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ExportError(f"{path} is corrupt: safetensors header is not valid JSON ({one_line(e)})")
        if not isinstance(header, dict):
            raise ExportError(f"{path} is corrupt: safetensors header is not a JSON object")
        self.data_start = 8 + header_len
        data_len = size - self.data_start
        self.entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            self.entries[name] = self._check_entry(name, info, data_len)

    def _check_entry(self, name, info, data_len):
        def bad(what):
            return ExportError(f"{self.path} is corrupt: tensor {name!r}: {what}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        if not isinstance(info, dict):
            raise bad("entry is not a JSON object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise bad("missing dtype")
        if not isinstance(shape, list) or not all(is_int(d) for d in shape):
            raise bad(f"invalid shape {shape!r}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets) \
                or offsets[0] > offsets[1]:
            raise bad(f"invalid data_offsets {offsets!r}")
        begin, end = offsets
        if end > data_len:
            raise ExportError(f"{self.path} is truncated or corrupt: tensor {name!r} ends at byte {end} "
                              f"of a {data_len}-byte data section")
        if dtype in SAFETENSORS_DTYPES:
            nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
            if nbytes != end - begin:
                raise bad(f"shape {shape} of {dtype} needs {nbytes} bytes but data_offsets span {end - begin}")
        return dtype, tuple(shape), begin, end

    def keys(self):
        return self.entries.keys()

    def shape(self, key):
        return self.entries[key][1]

    def is_float(self, key):
        dtype = self.entries[key][0]
        return dtype in SAFETENSORS_DTYPES and SAFETENSORS_DTYPES[dtype][2] is not None

    def dtype_name(self, key):
        return self.entries[key][0]

    def load(self, key):
        """The tensor, read straight from the file into its own buffer (no whole-file copy)."""
        import numpy as np
        import torch
        dtype, shape, begin, end = self.entries[key]
        np_dtype, _, torch_name = SAFETENSORS_DTYPES[dtype]
        arr = np.empty(shape, dtype=np_dtype)
        self.file.seek(self.data_start + begin)
        if self.file.readinto(arr.reshape(-1).view(np.uint8)) != end - begin:
            raise ExportError(f"{self.path} is truncated: could not read tensor {key!r}")
        t = torch.from_numpy(arr)
        if torch_name == "bfloat16":
            t = t.view(torch.bfloat16)
        return t

    def close(self):
        self.file.close()


# The records torch.save writes into a zip checkpoint of plain tensors (names inside the
# archive's one folder): the pickle, its tensors' storages, and format markers (byteorder
# since torch 2.1, .data/serialization_id since 2.2).
PLAIN_RECORDS = {"data.pkl", "version", "byteorder", ".data/serialization_id"}
# Records that only a TorchScript archive (torch.jit.save) has.
TORCHSCRIPT_RECORDS = ("code/", "constants.pkl", ".data/version", "extra/", "bytecode.pkl")


def unexpected_record(records):
    """The first record of a zip checkpoint that is not part of a plain tensor pickle
    (record names without the archive's folder), or None."""
    if "data.pkl" not in records:
        return "(no data.pkl)"
    for name in records:
        storage = name.startswith("data/") and len(name) > 5 and "/" not in name[5:]
        if name not in PLAIN_RECORDS and not storage:
            return name
    return None


def refuse_record(path, name):
    if any(name.startswith(r) if r.endswith("/") else name == r for r in TORCHSCRIPT_RECORDS):
        return ExportError(f"{path} is a TorchScript program (it has {name}), not a checkpoint of plain tensors; "
                           f"refusing to load it, since loading would run its code (see README \"Security\")")
    return ExportError(f"{path} is not a plain tensor checkpoint (unexpected archive entry {name}); refusing "
                       f"to load it (see README \"Security\")")


def check_zip_checkpoint(path):
    """torch.load(weights_only=True) hands a zip with TorchScript records to torch.jit.load,
    which runs the archive's code (a scripted __setstate__) before any check: so a zip
    checkpoint must hold exactly what torch.save writes for plain tensors. Read with
    zipfile, without torch."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise ExportError(f"cannot load {path} as a PyTorch checkpoint (corrupt or truncated zip archive: "
                          f"{one_line(e)})")
    folder = names[0].split("/", 1)[0] + "/" if names else ""
    records = []
    for name in names:
        if not name.startswith(folder) or name == folder:
            raise refuse_record(path, name)
        records.append(name[len(folder):])
    if len(set(records)) != len(records):
        raise refuse_record(path, next(r for r in records if records.count(r) > 1) + " (twice)")
    bad = unexpected_record(records)
    if bad:
        raise refuse_record(path, bad)


class TorchCheckpoint:
    """A .ckpt (torch.save) file, loaded with weights_only=True; tensors handed out once each.
    A zip archive is first checked to be a plain tensor pickle (check_zip_checkpoint)."""

    def __init__(self, path):
        try:
            with open(path, "rb") as f:
                is_zip = f.read(2) == b"PK"
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or one_line(e)}")
        if is_zip:
            check_zip_checkpoint(path)
        import torch
        self.path = path
        try:
            if is_zip:
                # The same check on the records as torch's own zip reader lists them: the one
                # torch.load asks whether the archive is TorchScript.
                bad = unexpected_record(torch._C.PyTorchFileReader(path).get_all_records())
                if bad:
                    raise refuse_record(path, bad)
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or one_line(e)}")
        except ExportError:
            raise
        except Exception as e:  # torch raises many types for corrupt or unsafe pickles
            raise ExportError(f"cannot load {path} as a PyTorch checkpoint (corrupt, truncated, or not loadable "
                              f"with weights_only=True): {one_line(e)}")
        if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = obj["state_dict"]
        if not isinstance(obj, dict):
            raise ExportError(f"{path} does not contain a state dict")
        self.sd = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}

    def keys(self):
        return self.sd.keys()

    def shape(self, key):
        return tuple(self.sd[key].shape)

    def is_float(self, key):
        return self.sd[key].is_floating_point()

    def dtype_name(self, key):
        return str(self.sd[key].dtype).replace("torch.", "")

    def load(self, key):
        # pop: the checkpoint's copy goes away as soon as the model owns the weights.
        return self.sd.pop(key)

    def close(self):
        self.sd.clear()


class DiffusersCheckpoint:
    """A diffusers folder's unet, vae and text_encoder weight files read as one checkpoint,
    their keys prefixed with "unet/", "vae/" and "text_encoder/"."""

    def __init__(self, path, files):
        self.path = path
        self.parts = {DIFFUSERS_PARTS[part]: open_weight_file(f) for part, f in files.items()}

    def _split(self, key):
        prefix, _, rest = key.partition("/")
        return self.parts[prefix + "/"], rest

    def keys(self):
        return [prefix + k for prefix, f in self.parts.items() for k in f.keys()]

    def shape(self, key):
        f, k = self._split(key)
        return f.shape(k)

    def is_float(self, key):
        f, k = self._split(key)
        return f.is_float(k)

    def dtype_name(self, key):
        f, k = self._split(key)
        return f.dtype_name(k)

    def load(self, key):
        f, k = self._split(key)
        return f.load(k)

    def close(self):
        for f in self.parts.values():
            f.close()


def open_weight_file(path):
    if not os.path.exists(path):
        raise ExportError(f"checkpoint {path} does not exist")
    if path.lower().endswith(".safetensors"):
        return SafetensorsFile(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ExportError(f"cannot open {path}: {e.strerror or e}")
    # zip (torch.save) or a legacy pickle; anything else is tried as safetensors.
    if magic.startswith(b"PK") or magic[:1] == b"\x80" or not magic:
        return TorchCheckpoint(path)
    return SafetensorsFile(path)


def open_checkpoint(path, folder=None):
    """A single-file checkpoint, or the weights of a diffusers folder (folder = its read_folder())."""
    if folder is not None:
        return DiffusersCheckpoint(path, folder["files"])
    if os.path.isdir(path):
        raise ExportError(f"{path} is a directory but not a diffusers folder (no model_index.json)")
    return open_weight_file(path)


# --------------------------------------------------------------------------- building and loading

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


def build_modules(unet_cfg, vae_cfg, text_cfg):
    import sd_modules
    with no_init():
        text = sd_modules.TextEncoder(text_cfg["vocab"], text_cfg["ctx"], text_cfg["width"], text_cfg["layers"],
                                      text_cfg["heads"], text_cfg["hidden"], text_cfg["quick_gelu"], text_cfg["eps"])
        unet = sd_modules.UNetModel(**unet_cfg)
        vae = sd_modules.VAEDecoder(**vae_cfg)
    return {"text_encoder": text, "unet": unet, "vae_decoder": vae}


class Ref:
    """Where a module weight comes from: checkpoint tensor `key`, or the `part`-th of `parts`
    equal slices of it along dim 0 (open_clip's in_proj holds q, k and v one after another)."""

    def __init__(self, key, part=0, parts=1):
        self.key, self.part, self.parts = key, part, parts

    def shape(self, ckpt):
        shape = ckpt.shape(self.key)
        if self.parts > 1 and shape:
            shape = (shape[0] // self.parts,) + tuple(shape[1:])
        return tuple(shape)


def detect_family(ckpt):
    """"sd1" or "sd2" from a single-file checkpoint's keys, or a one-line error."""
    keys = ckpt.keys()
    path = ckpt.path
    if not any(k.startswith(UNET_PREFIX) for k in keys):
        if any(k.startswith("conditioner.embedders.") for k in keys):
            raise ExportError(f"{path} looks like an SDXL checkpoint; only SD 1.x and 2.x are supported")
        raise ExportError(f"{path} is not a Stable Diffusion 1.x/2.x checkpoint (no {UNET_PREFIX}* keys)")
    if any(k.startswith(SD2_TEXT_PREFIX + "transformer.resblocks.") for k in keys):
        return "sd2"
    if any(k.startswith(TEXT_PREFIX) for k in keys):
        return "sd1"
    raise ExportError(f"{path} has no text encoder weights ({TEXT_PREFIX}* or {SD2_TEXT_PREFIX}*)")


def detect_unet_shapes(ckpt):
    """What the UNet's weight shapes tell beyond the family: linear or 1x1-conv transformer
    projections (SD 2.0 and 2.1 both use linear ones, but fine-tunes vary)."""
    for k in ckpt.keys():
        if k.startswith(UNET_PREFIX) and k.endswith(".proj_in.weight"):
            return {"use_linear_in_transformer": len(ckpt.shape(k)) == 2}
    return {}


def open_clip_text_layers(ckpt):
    layers = {int(m.group(1)) for k in ckpt.keys()
              for m in [re.match(re.escape(SD2_TEXT_PREFIX) + r"transformer\.resblocks\.(\d+)\.", k)] if m}
    return max(layers) + 1 if layers else 0


def text_cfg_from_open_clip(ckpt):
    """SD 2.x text sizes from the OpenCLIP weights; heads from the width (head size 64)."""
    p = SD2_TEXT_PREFIX
    try:
        vocab, width = ckpt.shape(p + "token_embedding.weight")
        ctx = ckpt.shape(p + "positional_embedding")[0]
        hidden = ckpt.shape(p + "transformer.resblocks.0.mlp.c_fc.weight")[0]
    except KeyError as e:
        raise ExportError(f"{ckpt.path}: OpenCLIP text weights incomplete (no {e})")
    total = open_clip_text_layers(ckpt)
    return dict(SD2_TEXT, vocab=vocab, ctx=ctx, width=width, hidden=hidden, layers_total=total, layers=total - 1,
                heads=OPEN_CLIP_HEADS.get(width, max(1, width // 64)))


# OpenCLIP resblock names -> HF CLIPTextModel layer names (as the modules use them).
OPEN_CLIP_LAYER_NAMES = (("self_attn.out_proj.", "attn.out_proj."), ("layer_norm1.", "ln_1."),
                         ("layer_norm2.", "ln_2."), ("mlp.fc1.", "mlp.c_fc."), ("mlp.fc2.", "mlp.c_proj."))


def open_clip_ref(k):
    """Ref of a TextEncoder weight (HF name) in an SD 2.x single-file checkpoint."""
    p = SD2_TEXT_PREFIX
    fixed = {"text_model.embeddings.token_embedding.weight": p + "token_embedding.weight",
             "text_model.embeddings.position_embedding.weight": p + "positional_embedding",
             "text_model.final_layer_norm.weight": p + "ln_final.weight",
             "text_model.final_layer_norm.bias": p + "ln_final.bias"}
    if k in fixed:
        return Ref(fixed[k])
    m = re.match(r"text_model\.encoder\.layers\.(\d+)\.(.*)$", k)
    if not m:
        raise KeyError(k)
    block, rest = f"{p}transformer.resblocks.{m.group(1)}.", m.group(2)
    qkv = re.match(r"self_attn\.([qkv])_proj\.(weight|bias)$", rest)
    if qkv:
        return Ref(f"{block}attn.in_proj_{qkv.group(2)}", "qkv".index(qkv.group(1)), 3)
    for hf, oc in OPEN_CLIP_LAYER_NAMES:
        if rest.startswith(hf):
            return Ref(block + oc + rest[len(hf):])
    raise KeyError(k)


def checkpoint_key_maps(ckpt, modules, family, unet_cfg, vae_cfg, diffusers=False):
    """{stage: {module key: Ref}} for a single-file checkpoint of `family` or a diffusers folder."""
    keys = set(ckpt.keys())
    if diffusers:
        levels = len(vae_cfg["ch_mult"])
        old_names = not any(k.startswith("vae/decoder.mid_block.attentions.0.to_q.") for k in keys)
        nrb = unet_cfg["num_res_blocks"]
        return {
            "text_encoder": {k: Ref("text_encoder/" + k) for k in modules["text_encoder"].state_dict()},
            "unet": {k: Ref("unet/" + diffusers_layout.unet_key(k, nrb)) for k in modules["unet"].state_dict()},
            "vae_decoder": {k: Ref("vae/" + diffusers_layout.vae_key(k, levels, old_names))
                            for k in modules["vae_decoder"].state_dict()},
        }
    if family == "sd2":
        text = {k: open_clip_ref(k) for k in modules["text_encoder"].state_dict()}
    else:
        # Old checkpoints (transformers < 4.17 era) have no 'text_model.' level.
        old_layout = not any(k.startswith(TEXT_PREFIX + "text_model.") for k in keys) \
            and any(k.startswith(TEXT_PREFIX + "encoder.") for k in keys)
        text = {k: Ref(TEXT_PREFIX + (k[len("text_model."):] if old_layout else k))
                for k in modules["text_encoder"].state_dict()}
    return {
        "text_encoder": text,
        "unet": {k: Ref(UNET_PREFIX + k) for k in modules["unet"].state_dict()},
        "vae_decoder": {k: Ref(VAE_PREFIX + k) for k in modules["vae_decoder"].state_dict()},
    }


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


def load_weights(ckpt, modules, maps):
    import torch
    users = {}  # checkpoint key -> [(stage, module key, ref)]: in_proj feeds three weights
    for stage, kmap in maps.items():
        for mk, ref in kmap.items():
            users.setdefault(ref.key, []).append((stage, mk, ref))
    owners = {stage: dict(module.named_modules()) for stage, module in modules.items()}
    for key, uses in users.items():
        full = ckpt.load(key)
        for stage, mk, ref in uses:
            owner_name, _, attr = mk.rpartition(".")
            param = getattr(owners[stage][owner_name], attr)
            t = full.chunk(ref.parts)[ref.part] if ref.parts > 1 else full
            t = t.reshape(param.shape)
            if t.dtype != torch.float32:
                t = t.float()
            elif ref.parts > 1 or not t.is_contiguous() or t.storage().size() != t.numel():
                t = t.clone()  # do not keep a larger shared storage alive
            param.data = t


def random_init(modules, seed):
    """Random weights for performance work: conv/linear N(0, 1/fan_in), zero biases,
    unit norm weights, CLIP-like embedding scales."""
    import torch
    from torch import nn
    g = torch.Generator().manual_seed(seed)
    for stage in ("text_encoder", "unet", "vae_decoder"):
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


# --------------------------------------------------------------------------- output

def find_tokenizer(tokenizer_dir, where="--tokenizer directory"):
    base = tokenizer_dir or os.path.join(REPO, "models", "clip")
    files = {name: os.path.join(base, name) for name in ("vocab.json", "merges.txt")}
    for name, path in files.items():
        if not os.path.isfile(path):
            where = where if tokenizer_dir else "repository's models/clip/"
            raise ExportError(f"tokenizer file {path} not found (the {where} must hold vocab.json and merges.txt)")
    return files


def read_vocab(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read tokenizer vocabulary {path}: {one_line(e)}")
    if not isinstance(vocab, dict):
        raise ExportError(f"tokenizer vocabulary {path} is not a JSON object")
    return vocab


# open_clip's tokenizer (SD 2.x) names the start and end tokens differently; the C++
# tokenizer reads the names from vocab.json to know which texts are special.
OPEN_CLIP_SPECIALS = {"<|startoftext|>": "<start_of_text>", "<|endoftext|>": "<end_of_text>"}


def open_clip_vocab(path):
    vocab = read_vocab(path)
    for clip_name, oc_name in OPEN_CLIP_SPECIALS.items():
        if clip_name in vocab:
            vocab[oc_name] = vocab.pop(clip_name)
    return vocab


def model_info(schedule, unet_cfg, vae_cfg, text_cfg, dtype, source, family, parameterization_source,
               latent_size=None):
    ac = alphas_cumprod(schedule)
    down = 2 ** (len(vae_cfg["ch_mult"]) - 1)
    info = {
        "format": 1,
        "family": family,
        "parameterization": schedule["parameterization"],
        "parameterization_source": parameterization_source,
        "dtype": dtype,
        "scale_factor": schedule["scale_factor"],
        "latent_channels": unet_cfg["in_channels"],
        "downsample_factor": down,
        "size_multiple": down * 2 ** (len(unet_cfg["channel_mult"]) - 1),
        "context_length": text_cfg["ctx"],
        "context_dim": text_cfg["width"],
        "bos_id": text_cfg["bos_id"], "eos_id": text_cfg["eos_id"], "pad_id": text_cfg["pad_id"],
        "tokenizer": "open_clip" if family == "sd2" else "clip",
        "text_layers_used": text_cfg["layers"],
        "num_timesteps": schedule["timesteps"],
        "linear_start": schedule["linear_start"], "linear_end": schedule["linear_end"],
        # Python floats holding exact float32 values: repr round-trips through double to the same float32.
        "alphas_cumprod": [float(a) for a in ac.tolist()],
        "source": source,
        # Architecture, for the C++ memory planner (src/memory_plan.cpp).
        "architecture": {"unet": unet_cfg, "vae": vae_cfg,
                         "text": {k: v for k, v in text_cfg.items() if k != "layers_total"}},
        "files": {"text_encoder": "text_encoder.pt", "unet": "unet.pt", "vae_decoder": "vae_decoder.pt",
                  "vocab": "vocab.json", "merges": "merges.txt"},
    }
    if latent_size:  # the picture size it was trained at, when the config says
        info["image_size"] = latent_size * down
    return info


def check_consistency(unet_cfg, vae_cfg, text_cfg):
    if unet_cfg["context_dim"] != text_cfg["width"]:
        raise ExportError(f"UNet context_dim {unet_cfg['context_dim']} differs from the text encoder width "
                          f"{text_cfg['width']} (give matching --config and --text-config)")
    if unet_cfg["in_channels"] != vae_cfg["embed_dim"]:
        raise ExportError(f"UNet in_channels {unet_cfg['in_channels']} differs from the VAE embed_dim "
                          f"{vae_cfg['embed_dim']}")


def count_params(module):
    return sum(p.numel() for p in module.parameters())


def assumed_parameterization(family, checkpoint):
    """(parameterization, why) for a single file exported without a config."""
    if family == "sd1":
        return "eps", "assumed: SD 1.x models predict eps"
    # SD 2.x comes as 768-v (v) and 512-base (eps) checkpoints with the same keys and shapes.
    name = os.path.basename(checkpoint).lower()
    if "512" in name or "base" in name:
        return "eps", "assumed from the file name ('512' or 'base': an SD 2.x base model predicting eps)"
    return "v", "assumed: SD 2.x 768-v models predict v (file name without '512' or 'base')"


def resolve(args):
    """Family, sizes, schedule and tokenizer of the model to export, and the opened checkpoint."""
    folder = None
    if args.checkpoint and diffusers_layout.is_diffusers_folder(args.checkpoint):
        if args.config:
            raise ExportError("--config is for single-file checkpoints; a diffusers folder has its own configs")
        try:
            folder = diffusers_layout.read_folder(args.checkpoint)
        except diffusers_layout.LayoutError as e:
            raise ExportError(str(e))
    ldm = load_ldm_config(args.config) if args.config else None
    ckpt = None if args.random_init else open_checkpoint(args.checkpoint, folder)
    r = {"ckpt": ckpt, "folder": folder, "tokenizer_dir": args.tokenizer}

    if folder:
        text_cfg = load_text_config(args.text_config or folder["text_config"])
        family = "sd1" if text_cfg["quick_gelu"] else "sd2"  # OpenCLIP's text tower uses GELU
        unet_cfg, vae_cfg, schedule = folder["unet"], folder["vae"], dict(folder["schedule"])
        p_source = "diffusers scheduler/scheduler_config.json (prediction_type)"
        r["tokenizer_dir"] = args.tokenizer or folder["tokenizer_dir"]
    else:
        family = detect_family(ckpt) if ckpt else (ldm["family"] if ldm else "sd1")
        if ldm and ldm["family"] != family:
            raise ExportError(f"{args.checkpoint} is an {family.upper().replace('SD', 'SD ')}.x checkpoint but "
                              f"config {args.config} describes an {ldm['family'].upper().replace('SD', 'SD ')}.x model")
        unet_default, text_default = FAMILY_DEFAULTS[family]
        if ldm:
            unet_cfg, vae_cfg, schedule = ldm["unet"], ldm["vae"], ldm["schedule"]
            p_source = f"config {os.path.basename(args.config)}"
        else:
            unet_cfg, vae_cfg, schedule = dict(unet_default), dict(SD1_VAE), dict(SD1_SCHEDULE)
            if ckpt:
                unet_cfg.update(detect_unet_shapes(ckpt))
                schedule["parameterization"], p_source = assumed_parameterization(family, args.checkpoint)
            else:
                p_source = "default for --random-init"
        if args.text_config:
            text_cfg = load_text_config(args.text_config)
        elif family == "sd2" and ckpt:
            text_cfg = text_cfg_from_open_clip(ckpt)
        else:
            text_cfg = dict(text_default)
        if ldm:  # the config says which layer's output SD uses
            text_cfg["layers"] = text_cfg["layers_total"] - (1 if ldm["text_layer"] == "penultimate" else 0)
        if family == "sd2" and ckpt and open_clip_text_layers(ckpt) != text_cfg["layers_total"]:
            raise ExportError(f"{args.checkpoint} has {open_clip_text_layers(ckpt)} OpenCLIP text layers but the text "
                              f"config says {text_cfg['layers_total']} (give a matching --text-config)")
    if args.parameterization:
        schedule["parameterization"], p_source = args.parameterization, "--parameterization"
    elif not folder and not ldm and ckpt and family == "sd2":
        say(f"{PROG}: note: no --config given: parameterization '{schedule['parameterization']}' "
            f"{p_source.split(':', 1)[0]}; override with --parameterization eps|v")

    tokenizer = find_tokenizer(r["tokenizer_dir"], "diffusers tokenizer/ folder" if folder and not args.tokenizer
                               else "--tokenizer directory")
    if folder:
        # The text encoder config's token ids are unreliable (SD 1.x's says bos 0, eos 2); the tokenizer's are not.
        vocab = read_vocab(tokenizer["vocab.json"])
        text_cfg["bos_id"] = vocab.get("<|startoftext|>", text_cfg["bos_id"])
        text_cfg["eos_id"] = vocab.get("<|endoftext|>", text_cfg["eos_id"])
        pad = folder["pad_token"]
        text_cfg["pad_id"] = vocab[pad] if pad in vocab else FAMILY_DEFAULTS[family][1]["pad_id"]
    latent_size = folder["latent_size"] if folder else (ldm["latent_size"] if ldm else None)
    r.update(family=family, unet=unet_cfg, vae=vae_cfg, text=text_cfg, schedule=schedule,
             parameterization_source=p_source, tokenizer=tokenizer, ldm=ldm, latent_size=latent_size)
    return r


def export(args):
    import torch
    import stage_files
    start = time.time()
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"output {out} exists and is not a directory")
    r = resolve(args)
    ckpt, family = r["ckpt"], r["family"]
    unet_cfg, vae_cfg, text_cfg, schedule = r["unet"], r["vae"], r["text"], r["schedule"]
    if ckpt is None:
        check_consistency(unet_cfg, vae_cfg, text_cfg)

    modules = build_modules(unet_cfg, vae_cfg, text_cfg)
    if ckpt is not None:
        maps = checkpoint_key_maps(ckpt, modules, family, unet_cfg, vae_cfg, diffusers=r["folder"] is not None)
        if r["folder"] or args.config or args.text_config:
            hint = "of the given configs"
        else:
            hint = f"(SD {family[2]}.x defaults; give --config/--text-config for other sizes)"
        check_keys(ckpt, modules, maps, hint)  # names the file: before the config-only checks below
        check_consistency(unet_cfg, vae_cfg, text_cfg)
        load_weights(ckpt, modules, maps)
        ckpt.close()
        source = os.path.basename(os.path.normpath(args.checkpoint))
    else:
        random_init(modules, args.seed)
        source = f"random-init (seed {args.seed})"

    dtype = torch.float16 if args.dtype == "float16" else torch.float32
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create output directory {out}: {e.strerror or e}")
    tag = f".tmp-{os.getpid()}"
    written = []  # (temp path, final path)
    try:
        for stage, module in modules.items():
            module.eval().requires_grad_(False)
            module.to(dtype)
            params = count_params(module)
            scripted = torch.jit.script(module)
            final = os.path.join(out, stage + ".pt")
            final_weights = stage_files.weights_path(final)
            stage_files.save_stage(scripted, final + tag, final_weights + tag)
            written += [(final + tag, final), (final_weights + tag, final_weights)]
            say(f"  {stage + '.weights':22s} {params / 1e6:8.1f} M parameters "
                f"{os.path.getsize(final_weights + tag) / 2**20:9.1f} MiB")
            del scripted
        for name, src in r["tokenizer"].items():
            final = os.path.join(out, name)
            if name == "vocab.json" and family == "sd2":
                with open(final + tag, "w", encoding="utf-8") as f:
                    json.dump(open_clip_vocab(src), f, ensure_ascii=False)
            else:
                shutil.copyfile(src, final + tag)
            written.append((final + tag, final))
        info = model_info(schedule, unet_cfg, vae_cfg, text_cfg, args.dtype, source, family,
                          r["parameterization_source"], r["latent_size"])
        if args.guidance_scale is not None:
            info["guidance_scale"] = args.guidance_scale
        final = os.path.join(out, "model.json")
        with open(final + tag, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
            f.write("\n")
        written.append((final + tag, final))
        # Everything is written: move into place, model.json last.
        for tmp, final in written:
            os.replace(tmp, final)
        written = []
    except OSError as e:
        raise ExportError(f"cannot write to {out}: {e.strerror or e}")
    finally:
        for tmp, _ in written:
            try:
                os.remove(tmp)
            except OSError:
                pass
    say(f"{PROG}: exported {source} -> {out} ({family}, {schedule['parameterization']}, {args.dtype}, "
        f"size multiple {info['size_multiple']}) in {time.time() - start:.1f} s")


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Export a Stable Diffusion 1.x or 2.x checkpoint "
                                "(.safetensors, .ckpt or a diffusers folder) to TorchScript files for the C++ program.")
    p.add_argument("checkpoint", nargs="?", help="single-file .safetensors / .ckpt, or a diffusers folder")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--config", help="LDM config yaml (v1-inference.yaml / v2-inference-v.yaml schema); "
                   "default: SD 1.x or 2.x sizes, detected from the checkpoint")
    p.add_argument("--text-config", help="text encoder sizes json; default: CLIP ViT-L/14 text (SD 1.x), "
                   "OpenCLIP ViT-H/14 text (SD 2.x)")
    p.add_argument("--tokenizer", help="directory with vocab.json and merges.txt; default: models/clip/ "
                   "(a diffusers folder's tokenizer/)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="storage dtype of the weights in the .pt files (default float32)")
    p.add_argument("--parameterization", choices=("eps", "v"),
                   help="what the UNet predicts; default: from the config or scheduler, else assumed "
                   "(SD 1.x: eps; SD 2.x: v, or eps when the file name says 512 or base)")
    p.add_argument("--guidance-scale", type=float,
                   help="the guidance scale the model is meant for: the CLI's --scale default for it "
                   "(default: none recorded, so the CLI's 7.5)")
    p.add_argument("--random-init", action="store_true",
                   help="random weights instead of a checkpoint (for tests and performance work)")
    p.add_argument("--seed", type=int, default=0, help="seed for --random-init (default 0)")
    args = p.parse_args(argv)
    if args.random_init and args.checkpoint:
        p.error("give either CHECKPOINT or --random-init, not both")
    if args.guidance_scale is not None and not (0 < args.guidance_scale <= 100):
        p.error("--guidance-scale must be above 0 and at most 100")
    if not args.random_init and not args.checkpoint:
        p.error("CHECKPOINT is required (or --random-init)")
    return args


def main(argv=None):
    args = parse_args(argv)
    warnings.simplefilter("ignore")  # keep stderr to the summary or the one error line
    try:
        export(args)
    except ExportError as e:
        say(f"{PROG}: error: {e}")
        return 1
    except MemoryError:
        say(f"{PROG}: error: out of memory while exporting {args.checkpoint or 'the random model'}")
        return 1
    except KeyboardInterrupt:
        say(f"{PROG}: error: interrupted")
        return 1
    except Exception as e:  # anything unforeseen still ends in one line
        say(f"{PROG}: error: exporting {args.checkpoint or 'the random model'} failed: "
            f"{type(e).__name__}: {one_line(e)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
