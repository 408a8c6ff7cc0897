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

The code is the sd_export package in python/ (python/sd_export/__init__.py lists its parts).
"""

import sys

import python_path  # noqa: F401  (makes python/sd_export importable)
from sd_export.cli import main

if __name__ == "__main__":
    sys.exit(main())
