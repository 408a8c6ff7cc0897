"""The .safetensors format, read and written here for every user: checkpoints, the
exported STAGE.weights files, the demo model's training and the tests.

A file is an 8-byte little-endian header length, a JSON header ({name: {"dtype",
"shape", "data_offsets"}}, optionally "__metadata__"), then the raw little-endian data.
Written here because no safetensors package is installed.
"""

import json
import math
import os
import struct

from .report import ExportError, one_line

DTYPES = {
    # name: (numpy dtype name, bytes per element, torch dtype name or None if only shape-checked)
    "F64": ("<f8", 8, "float64"), "F32": ("<f4", 4, "float32"), "F16": ("<f2", 2, "float16"),
    "BF16": ("<u2", 2, "bfloat16"),
    "I64": ("<i8", 8, None), "I32": ("<i4", 4, None), "I16": ("<i2", 2, None), "I8": ("i1", 1, None),
    "U8": ("u1", 1, None), "BOOL": ("?", 1, None),
}
# torch dtype name -> safetensors name, for writing.
WRITE_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
               "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


class SafetensorsFile:
    """Reads a .safetensors file lazily: the header up front, each tensor when asked for."""

    MAX_HEADER = 100 * 1024 * 1024

    def __init__(self, path):
        self.path = path
        try:
            self.file = open(path, "rb")
        except OSError as e:
            raise ExportError(f"cannot open {path}: {e.strerror or e}")
        size = os.fstat(self.file.fileno()).st_size
        head = self.file.read(8)
        if len(head) < 8:
            raise ExportError(f"{path} is not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            raise ExportError(f"{path} is truncated or not a safetensors file "
                              f"(header length {header_len} but the file has {size} bytes)")
        if header_len > self.MAX_HEADER:
            raise ExportError(f"{path} is not a safetensors file (header length {header_len} is implausible)")
        raw = self.file.read(header_len)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ExportError(f"{path} is corrupt: safetensors header is not valid JSON ({one_line(e)})")
        if not isinstance(header, dict):
            raise ExportError(f"{path} is corrupt: safetensors header is not a JSON object")
        self.header = header  # as read, for tools that rewrite it
        self.data_start = 8 + header_len
        data_len = size - self.data_start
        self.entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            self.entries[name] = self._check_entry(name, info, data_len)

    def _check_entry(self, name, info, data_len):
        def bad(what):
            return ExportError(f"{self.path} is corrupt: tensor {name!r}: {what}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        if not isinstance(info, dict):
            raise bad("entry is not a JSON object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise bad("missing dtype")
        if not isinstance(shape, list) or not all(is_int(d) for d in shape):
            raise bad(f"invalid shape {shape!r}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets) \
                or offsets[0] > offsets[1]:
            raise bad(f"invalid data_offsets {offsets!r}")
        begin, end = offsets
        if end > data_len:
            raise ExportError(f"{self.path} is truncated or corrupt: tensor {name!r} ends at byte {end} "
                              f"of a {data_len}-byte data section")
        if dtype in DTYPES:
            nbytes = math.prod(shape) * DTYPES[dtype][1]
            if nbytes != end - begin:
                raise bad(f"shape {shape} of {dtype} needs {nbytes} bytes but data_offsets span {end - begin}")
        return dtype, tuple(shape), begin, end

    def keys(self):
        return self.entries.keys()

    def shape(self, key):
        return self.entries[key][1]

    def is_float(self, key):
        dtype = self.entries[key][0]
        return dtype in DTYPES and DTYPES[dtype][2] is not None

    def dtype_name(self, key):
        return self.entries[key][0]

    def load(self, key):
        """The tensor, read straight from the file into its own buffer (no whole-file copy)."""
        import numpy as np
        import torch
        dtype, shape, begin, end = self.entries[key]
        np_dtype, _, torch_name = DTYPES[dtype]
        arr = np.empty(shape, dtype=np_dtype)
        self.file.seek(self.data_start + begin)
        if self.file.readinto(arr.reshape(-1).view(np.uint8)) != end - begin:
            raise ExportError(f"{self.path} is truncated: could not read tensor {key!r}")
        t = torch.from_numpy(arr)
        if torch_name == "bfloat16":
            t = t.view(torch.bfloat16)
        return t

    def data(self):
        """The raw data section, for tools that rewrite the header."""
        self.file.seek(self.data_start)
        return self.file.read()

    def close(self):
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_tensors(path):
    """{name: tensor} of a whole file."""
    with SafetensorsFile(path) as f:
        return {name: f.load(name) for name in f.keys()}


def encode_header(header, align=8):
    """The length field and the JSON header, padded with spaces so that the data
    section starts at a multiple of align."""
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-(8 + len(text)) % align)
    return struct.pack("<Q", len(text)) + text.encode("ascii")


def write_safetensors(path, tensors, metadata=None, align=8):
    """tensors: (name, tensor) pairs, stored in the order given; metadata: a {str: str}
    dict stored as "__metadata__", first."""
    import torch
    tensors = list(tensors)
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors:
        n = t.numel() * t.element_size()
        header[name] = {"dtype": WRITE_NAMES[str(t.dtype).replace("torch.", "")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    # numpy has no bfloat16: every tensor goes out through the integer type of its element size.
    same_size_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    with open(path, "wb") as f:
        f.write(encode_header(header, align))
        for _, t in tensors:
            t = t.detach().cpu().contiguous().reshape(-1)
            f.write(t.view(same_size_int[t.element_size()]).numpy().tobytes())
