#!/usr/bin/python3
"""Export a Stable Diffusion 1.x checkpoint to the model directory the C++ program reads.

    export_model.py CHECKPOINT --out DIR [--config LDM.yaml] [--text-config TEXT.json]
                    [--tokenizer DIR] [--dtype float32|float16]
    export_model.py --random-init --out DIR [--seed N] [--config ...] [--text-config ...]

CHECKPOINT is a CompVis-layout `.safetensors` or `.ckpt` file.  DIR receives
text_encoder.pt, unet.pt, vae_decoder.pt (TorchScript), vocab.json, merges.txt and
model.json; the format is described in docs/model-format.md.  Every failure prints
one line `export_model.py: error: ...` and exits with status 1.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "models"))

PROG = "export_model.py"

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_PREFIX = "cond_stage_model.transformer."
SD2_TEXT_PREFIX = "cond_stage_model.model."


class ExportError(Exception):
    """A failure to report as one line, without a traceback."""


def say(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- configuration

# configs/stable-diffusion/v1-inference.yaml
SD1_UNET = dict(in_channels=4, out_channels=4, model_channels=320, attention_resolutions=[4, 2, 1],
                num_res_blocks=2, channel_mult=[1, 2, 4, 4], num_heads=8, num_head_channels=-1,
                transformer_depth=1, context_dim=768)
SD1_VAE = dict(embed_dim=4, ch=128, out_ch=3, ch_mult=[1, 2, 4, 4], num_res_blocks=2, attn_resolutions=[],
               resolution=256, z_channels=4)
SD1_SCHEDULE = dict(linear_start=0.00085, linear_end=0.012, timesteps=1000, scale_factor=0.18215,
                    parameterization="eps")
# CLIP ViT-L/14 text transformer
SD1_TEXT = dict(vocab=49408, ctx=77, width=768, layers=12, heads=12, hidden=3072, quick_gelu=True, eps=1e-5,
                bos_id=49406, eos_id=49407, pad_id=49407)


def load_ldm_config(path):
    """UNet, VAE and schedule settings from a v1-inference.yaml-style LDM config."""
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

    cond_target = str((params.get("cond_stage_config") or {}).get("target", ""))
    if "OpenCLIP" in cond_target or unet_params.get("use_linear_in_transformer"):
        raise ExportError(f"config {path} describes an SD 2.x model; only SD 1.x is supported")
    unsupported = [k for k in ("use_scale_shift_norm", "resblock_updown", "num_classes", "use_fp16")
                   if unet_params.get(k)]
    if unet_params.get("dims", 2) != 2 or not unet_params.get("use_spatial_transformer", False) \
            or not unet_params.get("conv_resample", True):
        unsupported.append("dims/use_spatial_transformer/conv_resample")
    if unsupported:
        raise ExportError(f"config {path}: unsupported UNet options: {', '.join(unsupported)}")

    try:
        unet = dict(
            in_channels=int(unet_params["in_channels"]),
            out_channels=int(unet_params["out_channels"]),
            model_channels=int(unet_params["model_channels"]),
            attention_resolutions=[int(r) for r in unet_params["attention_resolutions"]],
            num_res_blocks=int(unet_params["num_res_blocks"]),
            channel_mult=[int(m) for m in unet_params["channel_mult"]],
            num_heads=int(unet_params.get("num_heads", -1)),
            num_head_channels=int(unet_params.get("num_head_channels", -1)),
            transformer_depth=int(unet_params.get("transformer_depth", 1)),
            context_dim=int(unet_params["context_dim"]),
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
    return unet, vae, schedule


def load_text_config(path):
    """Text transformer sizes: our text_encoder.json (vocab/ctx/width/layers/heads[, hf_config])
    or a plain HF CLIPTextConfig json."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            cfg = json.load(f)
    except OSError as e:
        raise ExportError(f"cannot read text config {path}: {e.strerror or e}")
    except ValueError as e:
        raise ExportError(f"text config {path} is not valid JSON: {one_line(e)}")
    if not isinstance(cfg, dict):
        raise ExportError(f"text config {path} is not a JSON object")
    hf = cfg.get("hf_config") if isinstance(cfg.get("hf_config"), dict) else None
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
        text["hidden"] = int(hf.get("intermediate_size", 4 * text["width"]))
        act = hf.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise ExportError(f"text config {path}: unsupported hidden_act {act!r}")
        text["quick_gelu"] = act == "quick_gelu"
        text["eps"] = float(hf.get("layer_norm_eps", 1e-5))
        text["bos_id"] = int(hf.get("bos_token_id", 49406))
        text["eos_id"] = int(hf.get("eos_token_id", 49407))
        text["pad_id"] = int(hf.get("pad_token_id", text["eos_id"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"text config {path}: missing or invalid field ({one_line(e)})")
    if text["width"] % text["heads"]:
        raise ExportError(f"text config {path}: width {text['width']} is not a multiple of heads {text['heads']}")
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


class TorchCheckpoint:
    """A .ckpt (torch.save) file, loaded with weights_only=True; tensors handed out once each."""

    def __init__(self, path):
        import torch
        self.path = path
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or one_line(e)}")
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


def open_checkpoint(path):
    if os.path.isdir(path):
        raise ExportError(f"{path} is a directory, not a checkpoint file (diffusers folders are not supported)")
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


def checkpoint_key_maps(ckpt, modules):
    """{stage: {module key: checkpoint key}}, after checking that this is an SD 1.x checkpoint."""
    keys = set(ckpt.keys())
    path = ckpt.path
    if any(k.startswith(SD2_TEXT_PREFIX) for k in keys):
        raise ExportError(f"{path} is an SD 2.x checkpoint (OpenCLIP text encoder, {SD2_TEXT_PREFIX}* keys); "
                          f"only SD 1.x is supported")
    if not any(k.startswith(UNET_PREFIX) for k in keys):
        if any(k.startswith("conditioner.embedders.") for k in keys):
            raise ExportError(f"{path} looks like an SDXL checkpoint; only SD 1.x is supported")
        raise ExportError(f"{path} is not a Stable Diffusion 1.x checkpoint (no {UNET_PREFIX}* keys)")
    # Old checkpoints (transformers < 4.17 era) have no 'text_model.' level.
    text_old_layout = not any(k.startswith(TEXT_PREFIX + "text_model.") for k in keys) \
        and any(k.startswith(TEXT_PREFIX + "encoder.") for k in keys)

    def text_key(k):
        return TEXT_PREFIX + (k[len("text_model."):] if text_old_layout else k)

    maps = {
        "text_encoder": {k: text_key(k) for k in modules["text_encoder"].state_dict()},
        "unet": {k: UNET_PREFIX + k for k in modules["unet"].state_dict()},
        "vae_decoder": {k: VAE_PREFIX + k for k in modules["vae_decoder"].state_dict()},
    }
    return maps


def check_keys(ckpt, modules, maps, hint):
    """Every weight present with the right shape and a float dtype, or one error naming them."""
    missing, wrong = [], []
    for stage, kmap in maps.items():
        expected = modules[stage].state_dict()
        for mk, ck in kmap.items():
            if ck not in ckpt.keys():
                missing.append(ck)
            elif ckpt.shape(ck) != tuple(expected[mk].shape):
                wrong.append(f"{ck} {list(ckpt.shape(ck))} (expected {list(expected[mk].shape)})")
            elif not ckpt.is_float(ck):
                wrong.append(f"{ck} has dtype {ckpt.dtype_name(ck)} (expected a float type)")

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
    for stage, kmap in maps.items():
        module = modules[stage]
        owners = dict(module.named_modules())
        for mk, ck in kmap.items():
            owner_name, _, attr = mk.rpartition(".")
            owner = owners[owner_name]
            t = ckpt.load(ck)
            if t.dtype != torch.float32:
                t = t.float()
            elif not t.is_contiguous() or t.storage().size() != t.numel():
                t = t.clone()  # do not keep a larger shared storage alive
            getattr(owner, attr).data = t


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

def find_tokenizer(tokenizer_dir):
    base = tokenizer_dir or os.path.join(REPO, "models", "clip")
    files = {name: os.path.join(base, name) for name in ("vocab.json", "merges.txt")}
    for name, path in files.items():
        if not os.path.isfile(path):
            where = "--tokenizer directory" if tokenizer_dir else "repository's models/clip/"
            raise ExportError(f"tokenizer file {path} not found (the {where} must hold vocab.json and merges.txt)")
    return files


def model_info(schedule, unet_cfg, vae_cfg, text_cfg, dtype, source):
    ac = alphas_cumprod(schedule)
    down = 2 ** (len(vae_cfg["ch_mult"]) - 1)
    return {
        "format": 1,
        "family": "sd1",
        "parameterization": schedule["parameterization"],
        "dtype": dtype,
        "scale_factor": schedule["scale_factor"],
        "latent_channels": unet_cfg["in_channels"],
        "downsample_factor": down,
        "size_multiple": down * 2 ** (len(unet_cfg["channel_mult"]) - 1),
        "context_length": text_cfg["ctx"],
        "context_dim": text_cfg["width"],
        "bos_id": text_cfg["bos_id"], "eos_id": text_cfg["eos_id"], "pad_id": text_cfg["pad_id"],
        "num_timesteps": schedule["timesteps"],
        "linear_start": schedule["linear_start"], "linear_end": schedule["linear_end"],
        # Python floats holding exact float32 values: repr round-trips through double to the same float32.
        "alphas_cumprod": [float(a) for a in ac.tolist()],
        "source": source,
        "files": {"text_encoder": "text_encoder.pt", "unet": "unet.pt", "vae_decoder": "vae_decoder.pt",
                  "vocab": "vocab.json", "merges": "merges.txt"},
    }


def check_consistency(unet_cfg, vae_cfg, text_cfg):
    if unet_cfg["context_dim"] != text_cfg["width"]:
        raise ExportError(f"UNet context_dim {unet_cfg['context_dim']} differs from the text encoder width "
                          f"{text_cfg['width']} (give matching --config and --text-config)")
    if unet_cfg["in_channels"] != vae_cfg["embed_dim"]:
        raise ExportError(f"UNet in_channels {unet_cfg['in_channels']} differs from the VAE embed_dim "
                          f"{vae_cfg['embed_dim']}")


def count_params(module):
    return sum(p.numel() for p in module.parameters())


def export(args):
    import torch
    start = time.time()
    if args.config:
        unet_cfg, vae_cfg, schedule = load_ldm_config(args.config)
    else:
        unet_cfg, vae_cfg, schedule = dict(SD1_UNET), dict(SD1_VAE), dict(SD1_SCHEDULE)
    text_cfg = load_text_config(args.text_config) if args.text_config else dict(SD1_TEXT)
    check_consistency(unet_cfg, vae_cfg, text_cfg)
    tokenizer = find_tokenizer(args.tokenizer)

    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"output {out} exists and is not a directory")

    ckpt = None
    if not args.random_init:
        ckpt = open_checkpoint(args.checkpoint)

    modules = build_modules(unet_cfg, vae_cfg, text_cfg)
    if ckpt is not None:
        maps = checkpoint_key_maps(ckpt, modules)
        hint = ("of the given --config/--text-config" if args.config or args.text_config
                else "(SD 1.x defaults; give --config/--text-config for other sizes)")
        check_keys(ckpt, modules, maps, hint)
        load_weights(ckpt, modules, maps)
        ckpt.close()
        source = os.path.basename(args.checkpoint)
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
            scripted = torch.jit.script(module)
            final = os.path.join(out, stage + ".pt")
            torch.jit.save(scripted, final + tag)
            written.append((final + tag, final))
            say(f"  {stage + '.pt':17s} {count_params(module) / 1e6:8.1f} M parameters "
                f"{os.path.getsize(final + tag) / 2**20:9.1f} MiB")
            del scripted
        for name, src in tokenizer.items():
            final = os.path.join(out, name)
            shutil.copyfile(src, final + tag)
            written.append((final + tag, final))
        info = model_info(schedule, unet_cfg, vae_cfg, text_cfg, args.dtype, source)
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
    say(f"{PROG}: exported {source} -> {out} ({args.dtype}, size multiple {info['size_multiple']}) "
        f"in {time.time() - start:.1f} s")


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Export a Stable Diffusion 1.x checkpoint "
                                "(.safetensors or .ckpt) to TorchScript files for the C++ program.")
    p.add_argument("checkpoint", nargs="?", help="CompVis-layout .safetensors or .ckpt file")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--config", help="LDM config yaml (v1-inference.yaml schema); default: SD 1.x")
    p.add_argument("--text-config", help="text encoder sizes json; default: CLIP ViT-L/14 text")
    p.add_argument("--tokenizer", help="directory with vocab.json and merges.txt; default: models/clip/")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="storage dtype of the weights in the .pt files (default float32)")
    p.add_argument("--random-init", action="store_true",
                   help="random weights instead of a checkpoint (for tests and performance work)")
    p.add_argument("--seed", type=int, default=0, help="seed for --random-init (default 0)")
    args = p.parse_args(argv)
    if args.random_init and args.checkpoint:
        p.error("give either CHECKPOINT or --random-init, not both")
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
