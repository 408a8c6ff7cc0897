#!/usr/bin/python3
"""Export a Stable Diffusion 1.x, 2.x or SDXL base model to the model directory the C++
program reads.

    export_model.py CHECKPOINT --out DIR [--unet-gguf FILE] [--config LDM.yaml] [--text-config TEXT.json]
                    [--text-config-2 TEXT2.json] [--tokenizer DIR] [--dtype float32|float16|bfloat16]
                    [--parameterization eps|v]
    export_model.py --random-init --out DIR [--seed N] [--config ...] [--text-config ...]

CHECKPOINT is a single-file CompVis / Stability-AI checkpoint (`.safetensors`, `.ckpt` or `.gguf`)
or a diffusers folder (model_index.json, unet/, vae/, text_encoder/, tokenizer/,
scheduler/; SDXL: also text_encoder_2/, tokenizer_2/).  The family is told by the keys
(`cond_stage_model.transformer.*`: SD 1.x's CLIP ViT-L text encoder;
`cond_stage_model.model.*`: SD 2.x's OpenCLIP ViT-H text tower; `conditioner.embedders.*`:
SDXL's two text encoders) and shapes, or by the config when given (LDM yaml, sgm's
sd_xl_base.yaml).  DIR receives text_encoder.pt, unet.pt, vae_decoder.pt (SDXL: also
text_encoder_2.pt; TorchScript, each with its .weights file), vocab.json, merges.txt and
model.json; the format is described in docs/model-format.md.  Every failure prints one line
`export_model.py: error: ...` and exits with status 1.

The code is the sd_export package in python/ (python/sd_export/__init__.py lists its parts).
"""

import sys

import python_path  # noqa: F401  (makes python/sd_export importable)
from sd_export.cli import main

if __name__ == "__main__":
    sys.exit(main())
