"""Writes a CompVis-style .ckpt ({"state_dict": ...}, zip format) holding the
tensors of a .safetensors file, so the repository need not carry both."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import torch  # noqa: E402
from export_model import SafetensorsFile  # noqa: E402

src, dst = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
st = SafetensorsFile(src)
torch.save({"state_dict": {k: st.load(k) for k in st.keys()}}, dst)
