"""Which model to build: the sizes, schedule and family of a Stable Diffusion 1.x, 2.x or SDXL
model, from an LDM config (v1-inference.yaml, v2-inference(-v).yaml; sgm's sd_xl_base.yaml),
text encoder configs, or a checkpoint's own keys and shapes when no config is given."""

import os
import re

from .jsonfile import read_json_object
from .keymaps import SD2_TEXT_PREFIX, SDXL_TEXT_2_PREFIX, SDXL_TEXT_PREFIX, TEXT_PREFIX, UNET_PREFIX
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

# Stability-AI generative-models configs/inference/sd_xl_base.yaml: no attention at the
# first level, per-level transformer depths, the vector input (pooled bigG + 6 x 256).
SDXL_UNET = dict(SD1_UNET, attention_resolutions=[4, 2], channel_mult=[1, 2, 4], num_heads=-1,
                 num_head_channels=64, transformer_depth=[1, 2, 10], context_dim=2048,
                 use_linear_in_transformer=True, adm_in_channels=2816)
SDXL_SCHEDULE = dict(SD1_SCHEDULE, scale_factor=0.13025)
# CLIP ViT-L/14 text, hidden_states[11] (11 of 12 layers, no final LayerNorm), and
# OpenCLIP ViT-bigG/14 text: all 32 layers (the pooled vector), penultimate state.
SDXL_TEXT = dict(SD1_TEXT, layers=11, final_norm=False)
SDXL_TEXT_2 = dict(vocab=49408, ctx=77, width=1280, layers=32, heads=20, hidden=5120, quick_gelu=False, eps=1e-5,
                   bos_id=49406, eos_id=49407, pad_id=0, layers_total=32, projection=1280)
SIZE_EMBEDDING_DIM = 256  # ConcatTimestepEmbedderND outdim of each of the six sizes

FAMILY_DEFAULTS = {"sd1": (SD1_UNET, SD1_TEXT), "sd2": (SD2_UNET, SD2_TEXT), "sdxl": (SDXL_UNET, SDXL_TEXT)}


def unet_settings(p, depth):
    """modules.UNetModel arguments from an openaimodel.UNetModel config's params (the
    LDM yaml's unet_config, sgm's network_config); KeyError/TypeError/ValueError when
    a setting is missing or invalid."""
    return dict(
        in_channels=int(p["in_channels"]),
        out_channels=int(p["out_channels"]),
        model_channels=int(p["model_channels"]),
        attention_resolutions=[int(r) for r in p["attention_resolutions"]],
        num_res_blocks=int(p["num_res_blocks"]),
        channel_mult=[int(m) for m in p["channel_mult"]],
        num_heads=int(p.get("num_heads", -1)),
        num_head_channels=int(p.get("num_head_channels", -1)),
        transformer_depth=depth,
        context_dim=int(p["context_dim"]),
        use_linear_in_transformer=bool(p.get("use_linear_in_transformer", False)),
    )


def vae_settings(first_stage):
    """modules.VAEDecoder arguments from an AutoencoderKL config's params."""
    dd = first_stage["ddconfig"]
    return dict(
        embed_dim=int(first_stage["embed_dim"]),
        ch=int(dd["ch"]),
        out_ch=int(dd["out_ch"]),
        ch_mult=[int(m) for m in dd["ch_mult"]],
        num_res_blocks=int(dd["num_res_blocks"]),
        attn_resolutions=[int(r) for r in dd.get("attn_resolutions", [])],
        resolution=int(dd["resolution"]),
        z_channels=int(dd["z_channels"]),
    )


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
        if "network_config" in cfg["model"]["params"]:
            return load_sgm_config(path, cfg["model"]["params"])
    except (KeyError, TypeError):
        pass
    try:
        params = cfg["model"]["params"]
        unet_params = params["unet_config"]["params"]
        first_stage = params["first_stage_config"]["params"]
        first_stage["ddconfig"]  # there, or the message below (vae_settings reads it)
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
        unet = unet_settings(unet_params, depth)
        vae = vae_settings(first_stage)
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


def _target(cfg):
    return str((cfg or {}).get("target", "")) if isinstance(cfg, dict) else ""


def load_sgm_config(path, params):
    """Settings from an sgm DiffusionEngine config (sd_xl_base.yaml): the UNet is
    network_config, the text encoders and size embedders the conditioner's emb_models."""
    try:
        unet_params = params["network_config"]["params"]
        first_stage = params["first_stage_config"]["params"]
        first_stage["ddconfig"]  # there, or the message below (vae_settings reads it)
        embedders = params["conditioner_config"]["params"]["emb_models"]
        targets = [_target(e) for e in embedders]
    except (KeyError, TypeError):
        raise ExportError(f"config {path} is not an sgm SDXL config (expected model.params.network_config, "
                          f"first_stage_config and conditioner_config.params.emb_models)")
    texts = [t.rsplit(".", 1)[-1] for t in targets if "CLIP" in t]
    if texts == ["FrozenOpenCLIPEmbedder2"]:
        raise ExportError(f"config {path} describes the SDXL refiner (one text encoder, OpenCLIP bigG): it refines "
                          f"the base model's latents and cannot make images from text; export the SDXL base")
    if texts != ["FrozenCLIPEmbedder", "FrozenOpenCLIPEmbedder2"]:
        raise ExportError(f"config {path}: text encoders {texts} are not SDXL base's "
                          f"(FrozenCLIPEmbedder, then FrozenOpenCLIPEmbedder2)")
    sizes = [e for e, t in zip(embedders, targets) if t.endswith("ConcatTimestepEmbedderND")]
    keys = [e.get("input_key") for e in sizes]
    if keys != ["original_size_as_tuple", "crop_coords_top_left", "target_size_as_tuple"]:
        raise ExportError(f"config {path}: size embedders {keys} are not SDXL base's "
                          f"(original_size_as_tuple, crop_coords_top_left, target_size_as_tuple)")
    clip_l = (embedders[targets.index(next(t for t in targets if t.endswith("FrozenCLIPEmbedder")))]
              .get("params") or {})
    bigg = (embedders[targets.index(next(t for t in targets if t.endswith("FrozenOpenCLIPEmbedder2")))]
            .get("params") or {})
    if clip_l.get("layer", "last") != "hidden" or bigg.get("layer", "last") != "penultimate" \
            or bigg.get("legacy", True):
        raise ExportError(f"config {path}: text encoder layers are not SDXL base's (CLIP-L layer: hidden, "
                          f"bigG layer: penultimate, legacy: False)")
    unsupported = [k for k in ("use_scale_shift_norm", "resblock_updown", "disable_self_attentions",
                               "num_attention_blocks") if unet_params.get(k)]
    if unet_params.get("num_classes") not in (None, "sequential"):
        unsupported.append(f"num_classes {unet_params.get('num_classes')}")
    if unsupported:
        raise ExportError(f"config {path}: unsupported UNet options: {', '.join(unsupported)}")
    scaling = _target(params.get("denoiser_config", {}).get("params", {}).get("scaling_config"))
    if scaling and not scaling.endswith(("EpsScaling", "VScaling")):
        raise ExportError(f"config {path}: unsupported denoiser scaling {scaling} (EpsScaling or VScaling)")
    disc = params.get("denoiser_config", {}).get("params", {}).get("discretization_config") or {}
    if _target(disc) and not _target(disc).endswith("LegacyDDPMDiscretization"):
        raise ExportError(f"config {path}: unsupported discretization {_target(disc)} (LegacyDDPMDiscretization)")
    disc_params = disc.get("params") or {}
    try:
        depth = unet_params.get("transformer_depth", 1)
        depth = [int(d) for d in depth] if isinstance(depth, list) else int(depth)
        unet = dict(unet_settings(unet_params, depth), adm_in_channels=int(unet_params["adm_in_channels"]))
        vae = vae_settings(first_stage)
        schedule = dict(linear_start=float(disc_params.get("linear_start", 0.00085)),
                        linear_end=float(disc_params.get("linear_end", 0.012)),
                        timesteps=int(params["denoiser_config"]["params"].get("num_idx", 1000)),
                        scale_factor=float(params.get("scale_factor", 1.0)),
                        parameterization="v" if scaling.endswith("VScaling") else "eps")
        size_dims = {int((e.get("params") or {})["outdim"]) for e in sizes}
        text_layer = int(clip_l.get("layer_idx", 11))
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"config {path}: missing or invalid UNet/VAE/conditioner setting ({one_line(e)})")
    if isinstance(depth, list) and len(depth) != len(unet["channel_mult"]):
        raise ExportError(f"config {path}: transformer_depth has {len(depth)} entries for "
                          f"{len(unet['channel_mult'])} levels")
    if len(size_dims) != 1:
        raise ExportError(f"config {path}: the size embedders differ in outdim ({sorted(size_dims)})")
    if unet["num_heads"] == -1 and unet["num_head_channels"] == -1:
        raise ExportError(f"config {path}: UNet needs num_heads or num_head_channels")
    return {"family": "sdxl", "unet": unet, "vae": vae, "schedule": schedule, "text_layer": "hidden",
            "text_layer_idx": text_layer, "size_embedding_dim": size_dims.pop(), "latent_size": None}


def load_text_config(path):
    """Text transformer sizes: our text_encoder.json (vocab/ctx/width/layers/heads[, layers_used,
    hf_config]) or a plain HF CLIPTextConfig json.  "layers" counts the layers in the
    checkpoint, "layers_used" those SD runs (SD 2.x: the penultimate layer's output)."""
    cfg = read_json_object(path, "text config")
    if isinstance(cfg.get("text_cfg"), dict):  # an open_clip model config (model_configs/*.json)
        return _open_clip_text_config(path, cfg)
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
        if "projection_dim" in hf or "projection_dim" in cfg:  # CLIPTextModelWithProjection (SDXL's second)
            text["projection"] = int(cfg.get("projection_dim") or hf["projection_dim"])
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


def _open_clip_text_config(path, cfg):
    """The text tower of an open_clip model config: GELU, pad id 0, head size from "heads"."""
    t = cfg["text_cfg"]
    try:
        text = dict(vocab=int(t.get("vocab_size", 49408)), ctx=int(t.get("context_length", 77)),
                    width=int(t["width"]), layers=int(t["layers"]), heads=int(t.get("heads", int(t["width"]) // 64)),
                    quick_gelu=bool(cfg.get("quick_gelu", False)), eps=1e-5,
                    bos_id=49406, eos_id=49407, pad_id=0, projection=int(cfg["embed_dim"]))
        text["hidden"] = int(text["width"] * float(t.get("mlp_ratio", 4.0)))
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"text config {path}: missing or invalid open_clip text_cfg field ({one_line(e)})")
    text["layers_total"] = text["layers"]
    if text["heads"] < 1 or text["width"] % text["heads"]:
        raise ExportError(f"text config {path}: width {text['width']} is not a multiple of heads {text['heads']}")
    return text


def alphas_cumprod(schedule):
    """ldm register_schedule ('linear'): float64 math, then the float32 buffer values."""
    import numpy as np
    betas = np.linspace(schedule["linear_start"] ** 0.5, schedule["linear_end"] ** 0.5, schedule["timesteps"],
                        dtype=np.float64) ** 2
    return np.cumprod(1.0 - betas, axis=0).astype(np.float32)


def check_consistency(unet_cfg, vae_cfg, text_cfg, text_cfg_2=None, size_embedding_dim=SIZE_EMBEDDING_DIM):
    if text_cfg_2 is not None:  # SDXL: the UNet reads both encoders' states and the vector
        if unet_cfg["context_dim"] != text_cfg["width"] + text_cfg_2["width"]:
            raise ExportError(f"UNet context_dim {unet_cfg['context_dim']} differs from the two text encoders' "
                              f"widths {text_cfg['width']} + {text_cfg_2['width']} (give matching --config, "
                              f"--text-config and --text-config-2)")
        want = text_cfg_2.get("projection", text_cfg_2["width"]) + 6 * size_embedding_dim
        if unet_cfg.get("adm_in_channels") != want:
            raise ExportError(f"UNet adm_in_channels {unet_cfg.get('adm_in_channels')} differs from the pooled "
                              f"text vector plus six size embeddings ({want})")
    elif unet_cfg["context_dim"] != text_cfg["width"]:
        raise ExportError(f"UNet context_dim {unet_cfg['context_dim']} differs from the text encoder width "
                          f"{text_cfg['width']} (give matching --config and --text-config)")
    latent = vae_cfg["embed_dim"]
    if unet_cfg["out_channels"] != latent:
        raise ExportError(f"UNet out_channels {unet_cfg['out_channels']} differs from the VAE embed_dim {latent}")
    if unet_cfg["in_channels"] not in unet_input_kinds(latent):
        raise ExportError(f"UNet in_channels {unet_cfg['in_channels']} is not one this tool runs: "
                          f"{describe_unet_inputs(latent)}")


def unet_input_kinds(latent_channels):
    """{UNet input channels: kind}: the latents alone, or an inpainting UNet's latents, mask
    and masked-picture latents (RunwayML's conditioning_key hybrid, diffusers' in_channels 9)."""
    return {latent_channels: "text to image", 2 * latent_channels + 1: "inpainting"}


def describe_unet_inputs(latent_channels):
    kinds = unet_input_kinds(latent_channels)
    return " or ".join(f"{n} ({kind})" for n, kind in kinds.items()) + \
        " (SD 2.x depth models, 5, and other conditioned UNets are not supported)"


# --------------------------------------------------------------------------- from a checkpoint's keys

def detect_family(ckpt):
    """"sd1", "sd2" or "sdxl" from a single-file checkpoint's keys, or a one-line error."""
    keys = ckpt.keys()
    path = ckpt.path
    if not any(k.startswith(UNET_PREFIX) for k in keys):
        raise ExportError(f"{path} is not a Stable Diffusion checkpoint (no {UNET_PREFIX}* keys)")
    if any(k.startswith("conditioner.embedders.") for k in keys):
        return detect_sdxl(ckpt)
    if any(k.startswith(SD2_TEXT_PREFIX + "transformer.resblocks.") for k in keys):
        return "sd2"
    if any(k.startswith(TEXT_PREFIX) for k in keys):
        return "sd1"
    raise ExportError(f"{path} has no text encoder weights ({TEXT_PREFIX}* or {SD2_TEXT_PREFIX}*)")


def detect_sdxl(ckpt):
    """An sgm checkpoint: SDXL base has CLIP-L at embedders.0 and OpenCLIP bigG at
    embedders.1; the refiner has bigG alone at embedders.0 (and a 2560-wide vector input)."""
    keys = ckpt.keys()
    has_l = any(k.startswith(SDXL_TEXT_PREFIX) for k in keys)
    has_g = any(k.startswith(SDXL_TEXT_2_PREFIX) for k in keys)
    if not has_l and any(k.startswith("conditioner.embedders.0.model.") for k in keys):
        adm = ckpt.shape(UNET_PREFIX + "label_emb.0.0.weight")[1] if UNET_PREFIX + "label_emb.0.0.weight" in keys \
            else "unknown"
        raise ExportError(f"{ckpt.path} is an SDXL refiner checkpoint (one text encoder, OpenCLIP bigG, and a "
                          f"{adm}-wide vector input): it refines the base model's latents and cannot make images "
                          f"from text alone; export the SDXL base checkpoint")
    if not has_l:
        raise ExportError(f"{ckpt.path} is an SDXL checkpoint without its first text encoder "
                          f"({SDXL_TEXT_PREFIX}*, CLIP ViT-L)")
    if not has_g:
        raise ExportError(f"{ckpt.path} is an SDXL checkpoint without its second text encoder "
                          f"({SDXL_TEXT_2_PREFIX}*, OpenCLIP ViT-bigG): the file is incomplete")
    return "sdxl"


def detect_unet_shapes(ckpt):
    """What the UNet's weight shapes tell beyond the family: linear or 1x1-conv transformer
    projections (SD 2.0 and 2.1 both use linear ones, but fine-tunes vary), and the input
    channels (9: an inpainting model such as sd-v1-5-inpainting)."""
    found = {}
    in_channels = unet_input_channels(ckpt)
    if in_channels is not None:
        found["in_channels"] = in_channels
    for k in ckpt.keys():
        if k.startswith(UNET_PREFIX) and k.endswith(".proj_in.weight"):
            found["use_linear_in_transformer"] = len(ckpt.shape(k)) == 2
            break
    return found


UNET_INPUT_CONV = UNET_PREFIX + "input_blocks.0.0.weight"


def unet_input_channels(ckpt):
    """The input channels of a single file's UNet (its first convolution), or None."""
    if UNET_INPUT_CONV not in ckpt.keys():
        return None
    shape = ckpt.shape(UNET_INPUT_CONV)
    return int(shape[1]) if len(shape) == 4 else None


def open_clip_text_layers(ckpt, prefix=SD2_TEXT_PREFIX):
    layers = {int(m.group(1)) for k in ckpt.keys()
              for m in [re.match(re.escape(prefix) + r"transformer\.resblocks\.(\d+)\.", k)] if m}
    return max(layers) + 1 if layers else 0


def text_cfg_from_open_clip(ckpt, prefix=SD2_TEXT_PREFIX):
    """OpenCLIP text sizes from its weights; heads from the width (head size 64).
    SD 2.x: the penultimate layer is the last one built; SDXL's bigG: all are (the
    pooled vector), with its text_projection."""
    p = prefix
    try:
        vocab, width = ckpt.shape(p + "token_embedding.weight")
        ctx = ckpt.shape(p + "positional_embedding")[0]
        hidden = ckpt.shape(p + "transformer.resblocks.0.mlp.c_fc.weight")[0]
        projection = ckpt.shape(p + "text_projection")[1] if prefix == SDXL_TEXT_2_PREFIX else None
    except KeyError as e:
        raise ExportError(f"{ckpt.path}: OpenCLIP text weights incomplete (no {e})")
    total = open_clip_text_layers(ckpt, prefix)
    if prefix == SDXL_TEXT_2_PREFIX:
        if width not in OPEN_CLIP_HEADS:
            raise ExportError(f"{ckpt.path}: the OpenCLIP text encoder is {width} wide, not a released size: "
                              f"give its config with --text-config-2 (open_clip or HF CLIPTextConfig json)")
        return dict(SDXL_TEXT_2, vocab=vocab, ctx=ctx, width=width, hidden=hidden, layers_total=total, layers=total,
                    heads=OPEN_CLIP_HEADS[width], projection=projection)
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
