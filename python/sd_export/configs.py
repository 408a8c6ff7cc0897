"""Which model to build: the sizes, schedule and family of a Stable Diffusion 1.x / 2.x
model, from an LDM config (v1-inference.yaml, v2-inference(-v).yaml), a text encoder config,
or a checkpoint's own keys and shapes when no config is given."""

import json
import os
import re

from .keymaps import SD2_TEXT_PREFIX, TEXT_PREFIX, UNET_PREFIX
from .report import ExportError, one_line

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


def check_consistency(unet_cfg, vae_cfg, text_cfg):
    if unet_cfg["context_dim"] != text_cfg["width"]:
        raise ExportError(f"UNet context_dim {unet_cfg['context_dim']} differs from the text encoder width "
                          f"{text_cfg['width']} (give matching --config and --text-config)")
    if unet_cfg["in_channels"] != vae_cfg["embed_dim"]:
        raise ExportError(f"UNet in_channels {unet_cfg['in_channels']} differs from the VAE embed_dim "
                          f"{vae_cfg['embed_dim']}")


# --------------------------------------------------------------------------- from a checkpoint's keys

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


def assumed_parameterization(family, checkpoint):
    """(parameterization, why) for a single file exported without a config."""
    if family == "sd1":
        return "eps", "assumed: SD 1.x models predict eps"
    # SD 2.x comes as 768-v (v) and 512-base (eps) checkpoints with the same keys and shapes.
    name = os.path.basename(checkpoint).lower()
    if "512" in name or "base" in name:
        return "eps", "assumed from the file name ('512' or 'base': an SD 2.x base model predicting eps)"
    return "v", "assumed: SD 2.x 768-v models predict v (file name without '512' or 'base')"
