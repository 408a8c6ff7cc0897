"""The model folder the C++ program reads (docs/model-format.md): each stage as STAGE.pt
(the TorchScript code with empty placeholder parameters) and STAGE.weights (the
parameters, safetensors layout), the tokenizer files, and model.json; written all or
nothing.  The C++ loader maps STAGE.weights from the page cache instead of copying every
tensor into fresh memory (src/engine/stage_loader.cpp); Python reads a stage back with
load_stage.
"""

import json
import os
import shutil

# sd::attention and sd::linear, which the stages' code calls, must exist before torch.jit.load
# (and sd_blocked::*, the ResNet blocks' blocked route)
from . import blocked_ops  # noqa: F401
from . import ops  # noqa: F401
from .configs import alphas_cumprod
from .jsonfile import read_json_object
from .report import ExportError, say
from .safetensors_io import read_tensors, write_safetensors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALIGN = 64  # the data section starts here-aligned (the header is padded with spaces)
# The archive entry that records every parameter's shape beside the emptied
# placeholders, so the loader can refuse another model's weight file up front.
SHAPES_ENTRY = "parameter_shapes.json"


# --------------------------------------------------------------------------- stage files

def weights_path(stage_path):
    return os.path.splitext(stage_path)[0] + ".weights"


def write_weights(path, tensors):
    """tensors: (name, tensor) pairs. Wider elements first, so every tensor stays
    aligned to its element size."""
    write_safetensors(path, sorted(tensors, key=lambda nt: -nt[1].element_size()), align=ALIGN)


def save_stage(scripted, pt_path, weights_file, scales=None):
    """Writes the weights file and the TorchScript file. The module's parameters
    are emptied on the way (scripting shares them with the module it was made from).
    scales: an 8-bit stage's {LAYER.weight_scale: fp16 tensor} (sd_export/q8.py), written
    beside the parameters; the layers' weight_scale stays None in the code file."""
    import torch
    params = list(scripted.named_parameters())
    write_weights(weights_file, params + sorted((scales or {}).items()))
    shapes = json.dumps({name: list(p.shape) for name, p in params}, separators=(",", ":"))
    for _, p in params:
        p.data = torch.empty(0, dtype=p.dtype)
    torch.jit.save(scripted, pt_path, _extra_files={SHAPES_ENTRY: shapes})


def load_stage(path):
    """An exported stage as a TorchScript module with its weights in place."""
    import torch
    m = torch.jit.load(path, map_location="cpu")
    wpath = weights_path(path)
    if os.path.exists(wpath):
        tensors = read_tensors(wpath)
        for name, p in m.named_parameters():
            p.data = tensors[name]
        for name, t in tensors.items():  # an 8-bit layer's scales (sd_export/q8.py)
            if name.endswith(".weight_scale"):
                layer = m
                for part in name[:-len(".weight_scale")].split("."):
                    layer = getattr(layer, part)
                layer.weight_scale = t
    return m.eval()


# --------------------------------------------------------------------------- tokenizer files

def find_tokenizer(tokenizer_dir, where="--tokenizer directory"):
    base = tokenizer_dir or os.path.join(REPO, "models", "clip")
    files = {name: os.path.join(base, name) for name in ("vocab.json", "merges.txt")}
    for name, path in files.items():
        if not os.path.isfile(path):
            where = where if tokenizer_dir else "repository's models/clip/"
            raise ExportError(f"tokenizer file {path} not found (the {where} must hold vocab.json and merges.txt)")
    return files


def read_vocab(path):
    return read_json_object(path, "tokenizer vocabulary")


# open_clip's tokenizer (SD 2.x) names the start and end tokens differently; the C++
# tokenizer reads the names from vocab.json to know which texts are special.
OPEN_CLIP_SPECIALS = {"<|startoftext|>": "<start_of_text>", "<|endoftext|>": "<end_of_text>"}


def open_clip_vocab(path):
    vocab = read_vocab(path)
    for clip_name, oc_name in OPEN_CLIP_SPECIALS.items():
        if clip_name in vocab:
            vocab[oc_name] = vocab.pop(clip_name)
    return vocab


# --------------------------------------------------------------------------- model.json

def model_info(schedule, unet_cfg, vae_cfg, text_cfg, dtype, source, family, parameterization_source,
               latent_size=None, text_cfg_2=None, size_embedding_dim=256, vae_encoder=True):
    ac = alphas_cumprod(schedule)
    down = 2 ** (len(vae_cfg["ch_mult"]) - 1)
    info = {
        "format": 1,
        "family": family,
        "parameterization": schedule["parameterization"],
        "parameterization_source": parameterization_source,
        "dtype": dtype,
        "scale_factor": schedule["scale_factor"],
        "latent_channels": unet_cfg["out_channels"],
        # 4: the latents alone; 9: an inpainting UNet, whose input is the latents, the
        # latent-size mask and the masked picture's latents (docs/model-format.md).
        "unet_in_channels": unet_cfg["in_channels"],
        "downsample_factor": down,
        "size_multiple": down * 2 ** (len(unet_cfg["channel_mult"]) - 1),
        "context_length": text_cfg["ctx"],
        "context_dim": unet_cfg["context_dim"],
        "bos_id": text_cfg["bos_id"], "eos_id": text_cfg["eos_id"], "pad_id": text_cfg["pad_id"],
        "tokenizer": "open_clip" if family == "sd2" else "clip",
        "text_layers_used": text_cfg["layers"],
        # The modules call sd::attention for attention_mode 3 (sd_export/ops.py).
        "fused_attention": True,
        "num_timesteps": schedule["timesteps"],
        "linear_start": schedule["linear_start"], "linear_end": schedule["linear_end"],
        # Python floats holding exact float32 values: repr round-trips through double to the same float32.
        "alphas_cumprod": [float(a) for a in ac.tolist()],
        "source": source,
        # Architecture, for the C++ memory planner (src/memory/planner.cpp).
        "architecture": {"unet": unet_cfg, "vae": vae_cfg,
                         "text": {k: v for k, v in text_cfg.items() if k != "layers_total"}},
        "files": {"text_encoder": "text_encoder.pt", "unet": "unet.pt", "vae_decoder": "vae_decoder.pt",
                  "vocab": "vocab.json", "merges": "merges.txt"},
    }
    if vae_encoder:  # pictures to latents (img2img, inpainting); absent from older exports
        info["files"]["vae_encoder"] = "vae_encoder.pt"
    if latent_size:  # the picture size it was trained at, when the config says
        info["image_size"] = latent_size * down
    if text_cfg_2 is not None:  # SDXL (docs/model-format.md, "sdxl")
        info["sdxl"] = {"text_encoder_width": text_cfg["width"], "text_encoder_2_width": text_cfg_2["width"],
                        "text_encoder_2_pad_id": text_cfg_2["pad_id"], "pooled_dim": text_cfg_2["projection"],
                        "size_embedding_dim": size_embedding_dim, "adm_in_channels": unet_cfg["adm_in_channels"]}
        info["architecture"]["text_2"] = {k: v for k, v in text_cfg_2.items() if k != "layers_total"}
        info["files"]["text_encoder_2"] = "text_encoder_2.pt"
    return info


# --------------------------------------------------------------------------- the folder

def count_params(module):
    return sum(p.numel() for p in module.parameters())


def write_model_folder(out, modules, dtype, tokenizer, family, info, scales=None):
    """Scripts and writes every stage, copies the tokenizer files (SD 2.x: open_clip's
    token names) and writes model.json: each to a temporary name, then all moved into
    place, model.json last, so a failure leaves the previous model as it was.
    scales: {stage: its 8-bit layers' scales} for --dtype q8_0 (sd_export/q8.py)."""
    import torch
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
            final_weights = weights_path(final)
            save_stage(scripted, final + tag, final_weights + tag, (scales or {}).get(stage))
            written += [(final + tag, final), (final_weights + tag, final_weights)]
            say(f"  {stage + '.weights':22s} {params / 1e6:8.1f} M parameters "
                f"{os.path.getsize(final_weights + tag) / 2**20:9.1f} MiB")
            del scripted
        for name, src in tokenizer.items():
            final = os.path.join(out, name)
            if name == "vocab.json" and family == "sd2":
                with open(final + tag, "w", encoding="utf-8") as f:
                    json.dump(open_clip_vocab(src), f, ensure_ascii=False)
            else:
                shutil.copyfile(src, final + tag)
            written.append((final + tag, final))
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

