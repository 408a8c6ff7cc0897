"""Where each weight of our modules (the modules package: CompVis ldm names) is found in a checkpoint:
a CompVis / Stability-AI single file (SD 1.x: HF CLIPTextModel names under
cond_stage_model.transformer.; SD 2.x: open_clip's text tower, its q/k/v packed in one
in_proj; SDXL: sgm's conditioner.embedders.0/1) or a diffusers folder (diffusers_layout's names)."""

import re

from . import diffusers_layout

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_PREFIX = "cond_stage_model.transformer."
SD2_TEXT_PREFIX = "cond_stage_model.model."
SDXL_TEXT_PREFIX = "conditioner.embedders.0.transformer."
SDXL_TEXT_2_PREFIX = "conditioner.embedders.1.model."


class Ref:
    """Where a module weight comes from: checkpoint tensor `key`, or the `part`-th of `parts`
    equal slices of it along dim 0 (open_clip's in_proj holds q, k and v one after another),
    transposed if `transpose` (open_clip's text_projection is used as x @ P, a Linear's
    weight is P's transpose)."""

    def __init__(self, key, part=0, parts=1, transpose=False):
        self.key, self.part, self.parts, self.transpose = key, part, parts, transpose

    def shape(self, ckpt):
        shape = ckpt.shape(self.key)
        if self.parts > 1 and shape:
            shape = (shape[0] // self.parts,) + tuple(shape[1:])
        if self.transpose:
            shape = tuple(reversed(shape))
        return tuple(shape)


# OpenCLIP resblock names -> HF CLIPTextModel layer names (as the modules use them).
OPEN_CLIP_LAYER_NAMES = (("self_attn.out_proj.", "attn.out_proj."), ("layer_norm1.", "ln_1."),
                         ("layer_norm2.", "ln_2."), ("mlp.fc1.", "mlp.c_fc."), ("mlp.fc2.", "mlp.c_proj."))


def open_clip_ref(k, p=SD2_TEXT_PREFIX):
    """Ref of a TextEncoder(WithProjection) weight (HF name) in the open_clip text tower
    under prefix p (SD 2.x, or SDXL's second encoder)."""
    fixed = {"text_model.embeddings.token_embedding.weight": p + "token_embedding.weight",
             "text_model.embeddings.position_embedding.weight": p + "positional_embedding",
             "text_model.final_layer_norm.weight": p + "ln_final.weight",
             "text_model.final_layer_norm.bias": p + "ln_final.bias"}
    if k in fixed:
        return Ref(fixed[k])
    if k == "text_projection.weight":
        return Ref(p + "text_projection", transpose=True)
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
        maps = {
            "text_encoder": {k: Ref("text_encoder/" + k) for k in modules["text_encoder"].state_dict()},
            "unet": {k: Ref("unet/" + diffusers_layout.unet_key(k, nrb)) for k in modules["unet"].state_dict()},
            "vae_decoder": {k: Ref("vae/" + diffusers_layout.vae_key(k, levels, old_names))
                            for k in modules["vae_decoder"].state_dict()},
        }
        if "vae_encoder" in modules:
            maps["vae_encoder"] = {k: Ref("vae/" + diffusers_layout.vae_key(k, levels, old_names))
                                   for k in modules["vae_encoder"].state_dict()}
        if "text_encoder_2" in modules:  # SDXL: CLIPTextModelWithProjection, the same names
            maps["text_encoder_2"] = {k: Ref("text_encoder_2/" + k) for k in modules["text_encoder_2"].state_dict()}
        return maps
    # Both VAE stages under first_stage_model. (their names are ldm's)
    vae = {stage: {k: Ref(VAE_PREFIX + k) for k in modules[stage].state_dict()}
           for stage in ("vae_decoder", "vae_encoder") if stage in modules}
    if family == "sdxl":
        return {
            "text_encoder": {k: Ref(SDXL_TEXT_PREFIX + k) for k in modules["text_encoder"].state_dict()},
            "text_encoder_2": {k: open_clip_ref(k, SDXL_TEXT_2_PREFIX) for k in modules["text_encoder_2"].state_dict()},
            "unet": {k: Ref(UNET_PREFIX + k) for k in modules["unet"].state_dict()},
            **vae,
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
        **vae,
    }


def has_vae_encoder(ckpt, diffusers=False):
    """Whether the checkpoint holds the VAE encoder (every SD release does; a file stripped
    of it still exports, without the encoder stage)."""
    prefix = "vae/encoder." if diffusers else VAE_PREFIX + "encoder."
    return any(k.startswith(prefix) for k in ckpt.keys())
