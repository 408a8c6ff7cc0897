"""An exported stage on disk: STAGE.pt holds the TorchScript code with empty
placeholder parameters, STAGE.weights the parameters in the safetensors layout.
The C++ loader maps STAGE.weights from the page cache instead of copying every
tensor into fresh memory (src/model.cpp, docs/model-format.md); Python reads
them back with load_stage.
"""

import json
import os
import struct

import torch

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
BY_NAME = {v: k for k, v in DTYPES.items()}
ALIGN = 64  # the data section starts here-aligned (the header is padded with spaces)


def weights_path(stage_path):
    return os.path.splitext(stage_path)[0] + ".weights"


def write_weights(path, tensors):
    """tensors: (name, tensor) pairs. Wider elements first, so every tensor stays
    aligned to its element size."""
    tensors = sorted(tensors, key=lambda nt: -nt[1].element_size())
    header, offset = {}, 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-(8 + len(text)) % ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode("ascii"))
        for _, t in tensors:
            same_size_int = torch.int32 if t.element_size() == 4 else torch.int16
            f.write(t.detach().contiguous().reshape(-1).view(same_size_int).numpy().tobytes())


def read_weights(path):
    """{name: tensor} of a weights file (the tensors share one buffer)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dtype = BY_NAME[e["dtype"]]
        count = (end - begin) // torch.empty(0, dtype=dtype).element_size()
        t = torch.frombuffer(data, dtype=dtype, count=count, offset=8 + n + begin) if count else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
    return out


# The archive entry that records every parameter's shape beside the emptied
# placeholders, so the loader can refuse another model's weight file up front.
SHAPES_ENTRY = "parameter_shapes.json"


def save_stage(scripted, pt_path, weights_file):
    """Writes the weights file and the TorchScript file. The module's parameters
    are emptied on the way (scripting shares them with the module it was made from)."""
    params = list(scripted.named_parameters())
    write_weights(weights_file, params)
    shapes = json.dumps({name: list(p.shape) for name, p in params}, separators=(",", ":"))
    for _, p in params:
        p.data = torch.empty(0, dtype=p.dtype)
    torch.jit.save(scripted, pt_path, _extra_files={SHAPES_ENTRY: shapes})


def load_stage(path):
    """An exported stage as a TorchScript module with its weights in place."""
    m = torch.jit.load(path, map_location="cpu")
    wpath = weights_path(path)
    if os.path.exists(wpath):
        tensors = read_weights(wpath)
        for name, p in m.named_parameters():
            p.data = tensors[name]
    return m.eval()
