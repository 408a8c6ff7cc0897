"""--unet-gguf: a checkpoint whose UNet comes from a UNet-only GGUF file (stable-diffusion.cpp's
converter run on the UNet alone, or ComfyUI-GGUF's files), the text encoder and VAE from the
checkpoint beside it."""

import os

from .checkpoints import TensorOverlay
from .gguf_io import GgufFile
from .report import ExportError

UNET_PREFIX = "model.diffusion_model."
# CompVis names of the other parts: a full-model GGUF given as --unet-gguf lends its UNet alone.
OTHER_PARTS = ("cond_stage_model.", "first_stage_model.", "conditioner.", "model_ema.")


class UnetOverride(TensorOverlay):
    """The checkpoint's tensors, its model.diffusion_model.* replaced by the GGUF file's UNet.
    The GGUF names are CompVis' (model.diffusion_model.input_blocks...) or bare
    (input_blocks..., as ComfyUI-GGUF writes them); both are read under the CompVis name."""

    def __init__(self, base, unet_path):
        self.base, self.path = base, base.path
        if not os.path.isfile(unet_path):
            raise ExportError(f"--unet-gguf {unet_path} does not exist")
        self.overlay = GgufFile(unet_path)
        self.names = {}  # checkpoint key -> key in the GGUF file
        for k in self.overlay.keys():
            if k.startswith(OTHER_PARTS) or "." not in k:
                continue  # another part, or a schedule buffer such as alphas_cumprod
            full = k if k.startswith(UNET_PREFIX) else UNET_PREFIX + k
            if full in self.names:
                raise ExportError(f"--unet-gguf {unet_path} holds the UNet tensor {full[len(UNET_PREFIX):]} twice "
                                  f"({self.names[full]} and {k})")
            self.names[full] = k
        if not self.names:
            raise ExportError(f"--unet-gguf {unet_path} holds no UNet tensors (model.diffusion_model.* or bare "
                              f"input_blocks.*, middle_block.*, ...)")
        self.own = [k for k in base.keys() if not k.startswith(UNET_PREFIX)]

    def keys(self):
        return self.own + list(self.names)
