"""A small GGUF writer for the tests: valid files from tensors or raw blocks, with hooks to
write hostile ones (wrong counts, lengths, offsets, types)."""

import struct

import numpy as np

TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30, "q4_K": 12,
            "q2_K": 10, "q3_K": 11, "q5_K": 13, "q6_K": 14, "q8_K": 15}


def gstr(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_uint32(key, v):
    return gstr(key) + struct.pack("<II", 4, v)


def kv_string(key, v):
    return gstr(key) + struct.pack("<I", 8) + gstr(v)


class Tensor:
    """name, row-major shape, ggml type name, raw bytes (as stored)."""

    def __init__(self, name, shape, tname, raw):
        self.name, self.shape, self.tname, self.raw = name, list(shape), tname, raw
        self.type_id = TYPE_IDS[tname]
        self.offset = None  # set by build(); a test may override it


def f32_tensor(name, array):
    a = np.ascontiguousarray(array, dtype="<f4")
    return Tensor(name, a.shape, "f32", a.tobytes())


def build(tensors, kvs=(), alignment=32, version=3, n_tensors=None, n_kv=None, fix_offsets=True):
    """The file's bytes. kvs: encoded key-values (kv_uint32, kv_string, or raw bytes)."""
    kvs = list(kvs)
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs)
    offset = 0
    for t in tensors:
        if fix_offsets or t.offset is None:
            t.offset = offset
        offset += -(-len(t.raw) // alignment) * alignment
    for t in tensors:
        ne = list(reversed(t.shape))
        head += gstr(t.name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", t.type_id, t.offset)
    head += b"\0" * (-len(head) % alignment)
    data = b""
    for t in tensors:
        data += t.raw + b"\0" * (-len(t.raw) % alignment)
    return head + data
