"""Writes a CompVis-style .ckpt ({"state_dict": ...}, zip format) holding the
tensors of a .safetensors file, so the repository need not carry both.

    PYTHONPATH=python /usr/bin/python3 tests/make_ckpt.py IN.safetensors OUT.ckpt
"""
import os
import sys

import torch
from sd_export.safetensors_io import read_tensors

src, dst = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
torch.save({"state_dict": read_tensors(src)}, dst)
