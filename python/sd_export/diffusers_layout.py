"""Reading a diffusers folder (model_index.json, unet/, vae/, text_encoder/, tokenizer/,
scheduler/; SDXL: also text_encoder_2/ and tokenizer_2/) onto the modules of
the modules package.

The configs become the export's unet / vae / text / schedule settings, and each
module weight (CompVis-ldm name, as the modules use) is looked up under its diffusers
name.  Nothing here imports torch.
"""

import os
import re

from .jsonfile import read_json_object
from .report import ExportError


class LayoutError(ExportError):
    """A folder that is not a usable diffusers Stable Diffusion folder (one line)."""


# Weight files tried in order in each sub-folder.
WEIGHT_FILES = {
    "unet": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin",
             "diffusion_pytorch_model.fp16.safetensors", "diffusion_pytorch_model.fp16.bin"),
    "vae": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin",
            "diffusion_pytorch_model.fp16.safetensors", "diffusion_pytorch_model.fp16.bin"),
    "text_encoder": ("model.safetensors", "pytorch_model.bin", "model.fp16.safetensors", "pytorch_model.fp16.bin"),
}
WEIGHT_FILES["text_encoder_2"] = WEIGHT_FILES["text_encoder"]


def is_diffusers_folder(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "model_index.json"))


def read_json(path):
    return read_json_object(path, "diffusers config")


def weight_file(folder, part):
    for name in WEIGHT_FILES[part]:
        path = os.path.join(folder, part, name)
        if os.path.isfile(path):
            return path
    raise LayoutError(f"diffusers folder {folder} has no {part} weights ({part}/{WEIGHT_FILES[part][0]} "
                      f"or {part}/{WEIGHT_FILES[part][1]})")


def unet_settings(cfg, where):
    """UNet2DConditionModel config -> modules.UNetModel arguments (SDXL's "text_time"
    addition embedding: adm_in_channels, and the size embedding's width)."""
    for key in ("class_embed_type", "encoder_hid_dim"):
        if cfg.get(key):
            raise LayoutError(f"{where}: unsupported UNet option {key}={cfg[key]!r}")
    addition = cfg.get("addition_embed_type")
    if addition not in (None, "text_time"):
        raise LayoutError(f"{where}: unsupported UNet option addition_embed_type={addition!r}")
    try:
        boc = [int(c) for c in cfg["block_out_channels"]]
        down = list(cfg["down_block_types"])
        base = boc[0]
        mult = [c // base for c in boc]
        if any(m * base != c for m, c in zip(mult, boc)):
            raise LayoutError(f"{where}: block_out_channels {boc} are not multiples of the first")
        depth = cfg.get("transformer_layers_per_block", 1)
        if isinstance(depth, list):
            depth = [int(d) for d in depth]
            if len(depth) != len(boc) or any(isinstance(d, list) for d in cfg["transformer_layers_per_block"]):
                raise LayoutError(f"{where}: transformer_layers_per_block {depth} does not give one depth per level")
            if cfg.get("reverse_transformer_layers_per_block"):
                raise LayoutError(f"{where}: reverse_transformer_layers_per_block is not supported")
        elif not isinstance(depth, int):
            raise LayoutError(f"{where}: invalid transformer_layers_per_block {depth!r}")
        # diffusers' attention_head_dim is the number of heads (num_attention_heads in newer configs).
        heads = cfg.get("num_attention_heads") or cfg["attention_head_dim"]
        unet = dict(in_channels=int(cfg["in_channels"]), out_channels=int(cfg["out_channels"]),
                    model_channels=base,
                    # in the LDM configs' order: [4, 2, 1]
                    attention_resolutions=[2 ** i for i, t in reversed(list(enumerate(down))) if "CrossAttn" in t],
                    num_res_blocks=int(cfg["layers_per_block"]), channel_mult=mult,
                    num_heads=-1, num_head_channels=-1, transformer_depth=depth,
                    context_dim=int(cfg["cross_attention_dim"]),
                    use_linear_in_transformer=bool(cfg.get("use_linear_projection", False)))
        if addition == "text_time":
            unet["adm_in_channels"] = int(cfg["projection_class_embeddings_input_dim"])
            unet["size_embedding_dim"] = int(cfg.get("addition_time_embed_dim", 256))
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"{where}: missing or invalid UNet setting ({e})")
    if isinstance(heads, int):
        unet["num_heads"] = heads
    else:
        heads = [int(h) for h in heads]
        dims = {c // h for c, h in zip(boc, heads)}
        if len(dims) == 1:
            unet["num_head_channels"] = dims.pop()
        elif len(set(heads)) == 1:
            unet["num_heads"] = heads[0]
        else:
            raise LayoutError(f"{where}: attention heads {heads} fit neither a fixed head count nor a fixed head size")
    return unet


def vae_settings(cfg, where):
    """AutoencoderKL config -> modules.VAEDecoder / VAEEncoder arguments, and its scaling factor."""
    try:
        boc = [int(c) for c in cfg["block_out_channels"]]
        for half, types in (("decoder", "up_block_types"), ("encoder", "down_block_types")):
            if any("Attn" in t for t in cfg.get(types, [])):
                raise LayoutError(f"{where}: VAE {half} blocks with attention are not supported")
        vae = dict(embed_dim=int(cfg["latent_channels"]), ch=boc[0], out_ch=int(cfg["out_channels"]),
                   ch_mult=[c // boc[0] for c in boc], num_res_blocks=int(cfg["layers_per_block"]),
                   attn_resolutions=[], resolution=int(cfg.get("sample_size", 256)),
                   z_channels=int(cfg["latent_channels"]))
        return vae, float(cfg.get("scaling_factor", 0.18215))
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"{where}: missing or invalid VAE setting ({e})")


def schedule_settings(cfg, where):
    """Scheduler config -> schedule and parameterization."""
    kind = cfg.get("beta_schedule", "linear")
    if kind != "scaled_linear":
        raise LayoutError(f"{where}: beta_schedule {kind!r} is not supported (Stable Diffusion uses scaled_linear)")
    prediction = cfg.get("prediction_type", "epsilon")
    if prediction not in ("epsilon", "v_prediction"):
        raise LayoutError(f"{where}: prediction_type {prediction!r} is not supported (epsilon or v_prediction)")
    try:
        return dict(linear_start=float(cfg["beta_start"]), linear_end=float(cfg["beta_end"]),
                    timesteps=int(cfg.get("num_train_timesteps", 1000)),
                    parameterization="v" if prediction == "v_prediction" else "eps")
    except (KeyError, TypeError, ValueError) as e:
        raise LayoutError(f"{where}: missing or invalid scheduler setting ({e})")


def pad_token(folder, part="tokenizer"):
    """The tokenizer's pad token text (SD 1.x: <|endoftext|>; SD 2.x and SDXL's tokenizer_2: "!"), or None."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = os.path.join(folder, part, name)
        if os.path.isfile(path):
            pad = read_json(path).get("pad_token")
            if isinstance(pad, dict):
                pad = pad.get("content")
            if isinstance(pad, str):
                return pad
    return None


def read_folder(folder):
    """Everything the export needs from a diffusers folder's JSON files."""
    read_json(os.path.join(folder, "model_index.json"))
    has_text_2 = os.path.isdir(os.path.join(folder, "text_encoder_2"))
    if not os.path.isdir(os.path.join(folder, "text_encoder")) and has_text_2:
        raise LayoutError(f"diffusers folder {folder} is an SDXL refiner (text_encoder_2/ alone): it refines the "
                          f"base model's latents and cannot make images from text; export the SDXL base")
    for part in ("unet", "vae", "text_encoder"):
        if not os.path.isdir(os.path.join(folder, part)):
            raise LayoutError(f"diffusers folder {folder} has no {part}/ folder")
    unet_cfg_path = os.path.join(folder, "unet", "config.json")
    vae_cfg_path = os.path.join(folder, "vae", "config.json")
    sched_path = os.path.join(folder, "scheduler", "scheduler_config.json")
    unet = unet_settings(read_json(unet_cfg_path), unet_cfg_path)
    vae, scale_factor = vae_settings(read_json(vae_cfg_path), vae_cfg_path)
    if not os.path.isfile(sched_path):
        raise LayoutError(f"diffusers folder {folder} has no scheduler/scheduler_config.json")
    schedule = schedule_settings(read_json(sched_path), sched_path)
    schedule["scale_factor"] = scale_factor
    tok_dir = os.path.join(folder, "tokenizer")
    sample_size = read_json(unet_cfg_path).get("sample_size")
    sdxl = "adm_in_channels" in unet
    if sdxl and not os.path.isdir(os.path.join(folder, "text_encoder_2")):
        raise LayoutError(f"diffusers folder {folder} has an SDXL UNet but no text_encoder_2/ (incomplete)")
    if not sdxl and os.path.isdir(os.path.join(folder, "text_encoder_2")):
        raise LayoutError(f"diffusers folder {folder} has text_encoder_2/ but its UNet takes no vector input "
                          f"(addition_embed_type text_time): not an SDXL base folder")
    parts = ("unet", "vae", "text_encoder") + (("text_encoder_2",) if sdxl else ())
    info = {
        "unet": unet, "vae": vae, "schedule": schedule,
        "latent_size": sample_size if isinstance(sample_size, int) and sample_size > 0 else None,
        "text_config": os.path.join(folder, "text_encoder", "config.json"),
        "tokenizer_dir": tok_dir if os.path.isfile(os.path.join(tok_dir, "vocab.json")) else None,
        "pad_token": pad_token(folder),
        "files": {part: weight_file(folder, part) for part in parts},
    }
    if sdxl:
        info["size_embedding_dim"] = unet.pop("size_embedding_dim")
        info["text_config_2"] = os.path.join(folder, "text_encoder_2", "config.json")
        info["pad_token_2"] = pad_token(folder, "tokenizer_2")
    return info


# --------------------------------------------------------------------------- key names

RESNET_NAMES = (("in_layers.0.", "norm1."), ("in_layers.2.", "conv1."), ("emb_layers.1.", "time_emb_proj."),
                ("out_layers.0.", "norm2."), ("out_layers.3.", "conv2."), ("skip_connection.", "conv_shortcut."))


def _resnet(rest):
    for ldm, hf in RESNET_NAMES:
        if rest.startswith(ldm):
            return hf + rest[len(ldm):]
    raise KeyError(rest)


def unet_key(key, num_res_blocks):
    """diffusers name of an modules.UNetModel weight (ldm name)."""
    per_level = num_res_blocks + 1
    fixed = {"time_embed.0.": "time_embedding.linear_1.", "time_embed.2.": "time_embedding.linear_2.",
             "label_emb.0.0.": "add_embedding.linear_1.", "label_emb.0.2.": "add_embedding.linear_2.",
             "input_blocks.0.0.": "conv_in.", "out.0.": "conv_norm_out.", "out.2.": "conv_out."}
    for ldm, hf in fixed.items():
        if key.startswith(ldm):
            return hf + key[len(ldm):]
    m = re.match(r"(input_blocks|middle_block|output_blocks)\.(\d+)\.(?:(\d+)\.)?(.*)$", key)
    if not m:
        raise KeyError(key)
    part, n, rest = m.group(1), int(m.group(2)), m.group(4)
    layer = int(m.group(3)) if m.group(3) is not None else None
    if part == "middle_block":  # middle_block.N.rest (no layer index)
        rest = key.split(".", 2)[2]
        if n == 1:
            return "mid_block.attentions.0." + rest
        return f"mid_block.resnets.{n // 2}." + _resnet(rest)
    if part == "input_blocks":
        level, j = (n - 1) // per_level, (n - 1) % per_level
        if j == num_res_blocks:  # Downsample: op -> downsamplers.0.conv
            return f"down_blocks.{level}.downsamplers.0.conv." + rest[len("op."):]
        if layer == 0:
            return f"down_blocks.{level}.resnets.{j}." + _resnet(rest)
        return f"down_blocks.{level}.attentions.{j}." + rest
    i, j = n // per_level, n % per_level  # up_blocks count from the deepest level
    if layer == 0:
        return f"up_blocks.{i}.resnets.{j}." + _resnet(rest)
    if rest.startswith("conv."):  # Upsample (after the attention, if any)
        return f"up_blocks.{i}.upsamplers.0." + rest
    return f"up_blocks.{i}.attentions.{j}." + rest


VAE_ATTENTION_NAMES = {  # ldm -> (current diffusers, older diffusers)
    "norm.": ("group_norm.", "group_norm."), "q.": ("to_q.", "query."), "k.": ("to_k.", "key."),
    "v.": ("to_v.", "value."), "proj_out.": ("to_out.0.", "proj_attn."),
}


def _vae_attention(rest, old_names):
    for ldm, names in VAE_ATTENTION_NAMES.items():
        if rest.startswith(ldm):
            return names[1 if old_names else 0] + rest[len(ldm):]
    raise KeyError(rest)


def vae_key(key, levels, old_attention_names=False):
    """diffusers name of a modules.VAEDecoder or VAEEncoder weight (ldm name)."""
    if key.startswith(("post_quant_conv.", "quant_conv.")):
        return key
    half, _, rest = key.partition(".")
    if half not in ("decoder", "encoder"):
        raise KeyError(key)
    if rest.startswith(("conv_in.", "conv_out.")):
        return key
    if rest.startswith("norm_out."):
        return f"{half}.conv_norm_out." + rest[len("norm_out."):]
    m = re.match(r"mid\.(block_1|block_2|attn_1)\.(.*)$", rest)
    if m:
        if m.group(1) == "attn_1":
            return f"{half}.mid_block.attentions.0." + _vae_attention(m.group(2), old_attention_names)
        index = 0 if m.group(1) == "block_1" else 1
        return f"{half}.mid_block.resnets.{index}." + m.group(2).replace("nin_shortcut.", "conv_shortcut.")
    if half == "encoder":  # down_blocks in ldm's order, finest first
        m = re.match(r"down\.(\d+)\.(block|attn|downsample)\.(.*)$", rest)
        blocks, resampler = "down_blocks", "downsamplers"
    else:
        m = re.match(r"up\.(\d+)\.(block|attn|upsample)\.(.*)$", rest)
        blocks, resampler = "up_blocks", "upsamplers"
    if not m:
        raise KeyError(key)
    # diffusers numbers the decoder levels from the coarsest
    level = int(m.group(1)) if half == "encoder" else levels - 1 - int(m.group(1))
    kind, tail = m.group(2), m.group(3)
    if kind in ("upsample", "downsample"):
        return f"{half}.{blocks}.{level}.{resampler}.0." + tail
    j, tail = tail.split(".", 1)
    if kind == "attn":
        return f"{half}.{blocks}.{level}.attentions.{j}." + _vae_attention(tail, old_attention_names)
    return f"{half}.{blocks}.{level}.resnets.{j}." + tail.replace("nin_shortcut.", "conv_shortcut.")
