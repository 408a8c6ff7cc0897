"""TorchScript-ready modules of Stable Diffusion 1.x, 2.x and SDXL (CompVis / Stability-AI layouts).

Exportable modules, each with the state-dict names of the CompVis checkpoints
below its prefix so that weights load by name (SDXL: sgm's single-file names):

* text.py    ``TextEncoder``, ``TextEncoderWithProjection`` (CLIP / OpenCLIP text towers)
* unet.py    ``UNetModel``    <- ``model.diffusion_model.``
* vae.py     ``VAEDecoder``, ``VAEEncoder`` <- ``first_stage_model.``  (post_quant_conv + decoder;
             encoder + quant_conv, up to the posterior's moments)
* layers.py  the layers the UNet and VAE are built from, and the attention settings

The arithmetic follows the reference implementation operation by operation (same
op order, same eps values, fp32 GroupNorm in the UNet), so an fp32 run agrees with
the reference to float rounding.  Everything is written for ``torch.jit.script``:
one export serves every batch size and image size.
"""

import inspect

from . import layers, text, unet, vae
from .layers import (ATTN_ALL_HEADS, ATTN_CHUNKED, ATTN_FUSED, ATTN_PER_HEAD, DEFAULT_ATTENTION_CHUNK,
                     DEFAULT_ATTENTION_MODE, Conv2d, GroupNorm, LayerNorm, Linear)
from .text import (CLIPAttention, CLIPEmbeddings, CLIPEncoder, CLIPEncoderLayer, CLIPMLP, CLIPTextTransformer,
                   TextEncoder, TextEncoderWithProjection)
from .unet import (BasicTransformerBlock, CrossAttention, Downsample, EmbConv2d, FeedForward, GEGLU, GroupNorm32,
                   ResBlock, SpatialTransformer, TimestepEmbedSequential, UNetModel, Upsample, attention_heads,
                   timestep_embedding, transformer_norm, unet_norm)
from .vae import (AttnBlock, Decoder, DecoderLevel, DecoderMid, Encoder, EncoderLevel, ResnetBlock, VAEDecoder,
                  VAEDownsample, VAEEncoder, VAEUpsample, swish, vae_norm)

__all__ = ["ATTN_ALL_HEADS", "ATTN_CHUNKED", "ATTN_FUSED", "ATTN_PER_HEAD", "CLIPMLP", "DEFAULT_ATTENTION_CHUNK",
           "DEFAULT_ATTENTION_MODE", "GEGLU", "AttnBlock", "BasicTransformerBlock", "CLIPAttention", "CLIPEmbeddings",
           "CLIPEncoder", "CLIPEncoderLayer", "CLIPTextTransformer", "Conv2d", "CrossAttention", "Decoder",
           "DecoderLevel", "DecoderMid", "Downsample", "EmbConv2d", "Encoder", "EncoderLevel", "FeedForward",
           "GroupNorm", "GroupNorm32", "LayerNorm", "Linear", "ResBlock", "ResnetBlock", "SpatialTransformer",
           "TextEncoder", "TextEncoderWithProjection", "TimestepEmbedSequential", "UNetModel", "Upsample",
           "VAEDecoder", "VAEDownsample", "VAEEncoder", "VAEUpsample", "attention_heads", "swish",
           "timestep_embedding", "transformer_norm", "unet_norm", "vae_norm"]

# TorchScript names each class and function "__torch__." + its __module__ + "." + its
# name. Exports name them __torch__.sd_modules.* (these files were once models/sd_modules.py),
# and model folders already written, and the CLI's list of accepted names
# (src/io/op_allowlist.inc), carry that name. So every class and function of these files
# keeps it through TorchScript's qualified-name override, set on each one (a subclass
# would inherit its parent's, so none is left without its own); Python sees the real
# modules. A class defined elsewhere that subclasses one of these must set its own.
TORCHSCRIPT_MODULE = "sd_modules"


def _keep_torchscript_names():
    for module in (layers, text, unet, vae):
        for value in vars(module).values():
            if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == module.__name__:
                value._jit_override_qualname = f"__torch__.{TORCHSCRIPT_MODULE}.{value.__name__}"


_keep_torchscript_names()
