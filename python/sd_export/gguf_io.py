"""GGUF files (ggml's format, as stable-diffusion.cpp's converter and ComfyUI-GGUF write them),
read as a checkpoint: keys, shape, is_float, dtype_name, load (float tensors) and close.

A file is: magic "GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 key-value count,
the key-values (string key, uint32 value type, value), the tensor infos (string name, uint32
dimension count, uint64 ne[] innermost first, uint32 ggml type, uint64 offset into the data),
padding to the alignment (`general.alignment`, default 32), then the data. Strings are a
uint64 length and UTF-8 bytes; everything is little-endian.

The file is memory-mapped and only read as data. Every count, length and offset is checked
against the file size before it is used, so a hostile file is refused with one line.
Quantized blocks are expanded to float32 with ggml's arithmetic (one fp16 to fp32 conversion
and one multiply, or multiply-add, per value; the k-quants first scale the fp16 scale by the
sub-block's integer scale), in ggml's order, so the tensors equal those of ggml's own to_float
bit for bit (tests/data/ggml-blocks/ holds ggml's values for every type read).
"""

import mmap
import os
import struct

from .report import ExportError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS

# Key-value types: id -> (name, size of a fixed-size value or None).
KV_TYPES = {0: ("uint8", 1), 1: ("int8", 1), 2: ("uint16", 2), 3: ("int16", 2), 4: ("uint32", 4),
            5: ("int32", 4), 6: ("float32", 4), 7: ("bool", 1), 8: ("string", None), 9: ("array", None),
            10: ("uint64", 8), 11: ("int64", 8), 12: ("float64", 8)}
KV_STRING, KV_ARRAY, KV_UINT32 = 8, 9, 4

# ggml types this reader expands: id -> (name, values per block, bytes per block).
READ_TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 30: ("bf16", 1, 2), 28: ("f64", 1, 8),
              2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24),
              8: ("q8_0", 32, 34),
              # The k-quants: super-blocks of 256 values (ggml-common.h's QK_K).
              10: ("q2_K", 256, 84), 11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176),
              14: ("q6_K", 256, 210),
              24: ("i8", 1, 1), 25: ("i16", 1, 2), 26: ("i32", 1, 4), 27: ("i64", 1, 8)}
INT_TYPES = {"i8": "<i1", "i16": "<i2", "i32": "<i4", "i64": "<i8"}
# The other ggml types, named so that a file using one is refused by name.
# q8_K is the k-quants' dot-product intermediate: ggml gives it no to_float, and no file stores it.
OTHER_TYPES = {9: "q8_1", 15: "q8_K",
               16: "iq2_xxs", 17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s",
               23: "iq4_xs", 29: "iq1_m", 31: "q4_0_4_4", 32: "q4_0_4_8", 33: "q4_0_8_8", 34: "tq1_0",
               35: "tq2_0", 36: "iq4_nl_4_4", 37: "iq4_nl_4_8", 38: "iq4_nl_8_8", 39: "mxfp4", 40: "nvfp4",
               41: "q1_0", 42: "q2_0"}
SUPPORTED = "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K"

# The smallest encodings: a key-value (empty key, type, a one-byte value) and a tensor info
# (empty name, no dimensions, type, offset). They bound the counts before anything is read.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8


def is_gguf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


class _Cursor:
    """Reads little-endian values from the mapped header; any read past the end is an error."""

    def __init__(self, buf, path):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def fail(self, what):
        return ExportError(f"{self.path} is not a valid GGUF file: {what}")

    def need(self, n, what):
        if n > self.size - self.pos:
            raise ExportError(f"{self.path} is truncated: {what} at byte {self.pos} needs {n} bytes but the file "
                              f"has {self.size}")

    def unpack(self, fmt, what):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self, what):
        n = self.unpack("<Q", what + " length")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {self.pos - n} is not UTF-8")

    def skip_value(self, vtype, what):
        if vtype == KV_STRING:
            self.string(what)
        elif vtype == KV_ARRAY:
            etype = self.unpack("<I", what + " array type")
            count = self.unpack("<Q", what + " array length")
            if etype == KV_ARRAY:
                raise self.fail(f"{what} is an array of arrays")
            if etype not in KV_TYPES:
                raise self.fail(f"{what} has unknown array element type {etype}")
            size = KV_TYPES[etype][1]
            # Each element takes at least its fixed size, or a string's 8-byte length.
            self.need(count * (size or 8), f"{what} ({count} elements)")
            if size:
                self.pos += count * size
            else:
                for i in range(count):
                    self.string(f"{what}[{i}]")
        elif vtype in KV_TYPES:
            size = KV_TYPES[vtype][1]
            self.need(size, what)
            self.pos += size
        else:
            raise self.fail(f"{what} has unknown value type {vtype}")


class GgufFile:
    """A GGUF file's tensors by name, each expanded to a float tensor when loaded."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24:
                    raise ExportError(f"{path} is truncated: a GGUF header needs 24 bytes, the file has {size}")
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or e}")
        try:
            self.entries = self._parse(_Cursor(self.map, path))
        except Exception:
            self.map.close()
            raise

    def _parse(self, c):
        if bytes(c.buf[:4]) != MAGIC:
            raise c.fail("no GGUF magic")
        c.pos = 4
        version = c.unpack("<I", "version")
        if version not in (2, 3):
            raise c.fail(f"version {version} (this reader reads versions 2 and 3)")
        n_tensors, n_kv = c.unpack("<QQ", "counts")
        if n_kv > (c.size - c.pos) // MIN_KV_BYTES:
            raise ExportError(f"{c.path} is truncated or corrupt: {n_kv} key-values cannot fit in its {c.size} bytes")
        if n_tensors > (c.size - c.pos) // MIN_TENSOR_INFO_BYTES:
            raise ExportError(f"{c.path} is truncated or corrupt: {n_tensors} tensors cannot fit in its {c.size} bytes")
        alignment, keys = DEFAULT_ALIGNMENT, set()
        for i in range(n_kv):
            key = c.string(f"key {i}")
            if key in keys:
                raise c.fail(f"key {key!r} appears twice")
            keys.add(key)
            vtype = c.unpack("<I", f"type of {key!r}")
            if key == "general.alignment":
                if vtype != KV_UINT32:
                    raise c.fail("general.alignment is not a uint32")
                alignment = c.unpack("<I", key)
                if alignment == 0 or alignment & (alignment - 1):
                    raise c.fail(f"general.alignment {alignment} is not a power of two")
            else:
                c.skip_value(vtype, f"value of {key!r}")
        infos = []
        for i in range(n_tensors):
            name = c.string(f"name of tensor {i}")
            n_dims = c.unpack("<I", f"dimension count of {name!r}")
            if n_dims > MAX_DIMS:
                raise c.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
            ne = [c.unpack("<Q", f"shape of {name!r}") for _ in range(n_dims)]
            ttype, offset = c.unpack("<IQ", f"type and offset of {name!r}")
            infos.append((name, ne, ttype, offset))
        data_start = -(-c.pos // alignment) * alignment
        if data_start > c.size:
            raise ExportError(f"{c.path} is truncated: the data section starts at byte {data_start} but the file "
                              f"has {c.size}")
        data_len = c.size - data_start
        entries = {}
        for name, ne, ttype, offset in infos:
            if name in entries:
                raise c.fail(f"tensor {name!r} appears twice")
            if ttype not in READ_TYPES:
                if ttype in OTHER_TYPES:
                    raise ExportError(f"{c.path}: tensor {name!r} is stored as {OTHER_TYPES[ttype]}, which this "
                                      f"export does not read (it reads {SUPPORTED})")
                raise c.fail(f"tensor {name!r} has unknown ggml type {ttype}")
            tname, block, block_bytes = READ_TYPES[ttype]
            count = 1
            for d in ne:
                count *= d  # Python integers: no overflow, compared with the file size below
            if (ne[0] if ne else 1) % block:  # a block type's scalar (no dimensions) is no whole block either
                raise c.fail(f"tensor {name!r} is {tname} but its rows of {ne[0] if ne else 1} values are not "
                             f"whole blocks of {block}")
            if count == 0:  # found by tests/fuzz/fuzz_gguf.py: numpy refuses [2^63, 0]
                raise c.fail(f"tensor {name!r} has a dimension of 0")
            nbytes = count // block * block_bytes
            if offset % alignment:
                raise c.fail(f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment "
                             f"{alignment}")
            if offset > data_len or nbytes > data_len - offset:
                raise ExportError(f"{c.path} is truncated or corrupt: tensor {name!r} ({nbytes} bytes at offset "
                                  f"{offset}) ends past the {data_len}-byte data section")
            # Row-major shape: ggml's ne reversed.
            entries[name] = (tname, tuple(reversed(ne)), data_start + offset, nbytes)
        return entries

    def keys(self):
        return self.entries.keys()

    def shape(self, key):
        return self.entries[key][1]

    def is_float(self, key):
        return self.entries[key][0] not in INT_TYPES

    def dtype_name(self, key):
        return self.entries[key][0]

    def load(self, key):
        """The tensor: f32, f16, bf16 and f64 as stored, quantized types expanded to float32."""
        import numpy as np
        import torch
        tname, shape, begin, nbytes = self.entries[key]
        raw = np.frombuffer(self.map, dtype=np.uint8, count=nbytes, offset=begin)
        if tname in ("f32", "f16", "f64") or tname in INT_TYPES:
            np_dtype = {"f32": "<f4", "f16": "<f2", "f64": "<f8"}.get(tname) or INT_TYPES[tname]
            return torch.from_numpy(raw.view(np_dtype).reshape(shape).copy())
        if tname == "bf16":
            return torch.from_numpy(raw.view("<i2").reshape(shape).copy()).view(torch.bfloat16)
        return torch.from_numpy(dequantize(tname, raw).reshape(shape))

    def q8_0_blocks(self, key):
        """A q8_0 tensor's blocks as stored, de-interleaved: (int8 [blocks, 32], fp16 [blocks]),
        for an 8-bit export that keeps them (sd_export/q8.py); None for another type."""
        import numpy as np
        tname, _, begin, nbytes = self.entries[key]
        if tname != "q8_0":
            return None
        b = np.frombuffer(self.map, dtype=np.uint8, count=nbytes, offset=begin).view(np.dtype(BLOCKS["q8_0"]))
        return b["qs"].copy(), b["d"].copy()

    def close(self):
        self.map.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# The block records (ggml-common.h's block_q*): d and m are fp16.
BLOCKS = {
    "q8_0": [("d", "<f2"), ("qs", "i1", 32)],
    "q4_0": [("d", "<f2"), ("qs", "u1", 16)],
    "q4_1": [("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)],
    "q5_0": [("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)],
    "q5_1": [("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)],
}


def dequantize(tname, raw):
    """Blocks of 32 values to a flat float32 array, as ggml's dequantize_row_*."""
    import numpy as np
    if tname in K_BLOCKS:
        return dequantize_k(tname, raw)
    b = raw.view(np.dtype(BLOCKS[tname]))
    d = b["d"].astype(np.float32)[:, None]
    if tname == "q8_0":
        return (b["qs"].astype(np.float32) * d).reshape(-1)
    qs = b["qs"]
    # Low nibbles are values 0-15 of the block, high nibbles 16-31.
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)
    if tname in ("q5_0", "q5_1"):
        # Bit j of qh is the fifth bit of value j.
        q |= ((b["qh"][:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4
    if tname == "q4_0":
        return ((q - 8).astype(np.float32) * d).reshape(-1)
    if tname == "q5_0":
        return ((q - 16).astype(np.float32) * d).reshape(-1)
    m = b["m"].astype(np.float32)[:, None]
    return (q.astype(np.float32) * d + m).reshape(-1)


# The k-quant super-blocks (ggml-common.h's block_q*_K), 256 values each. d and dmin are fp16;
# the sub-block scales are small integers packed in bytes (see the functions below).
K_BLOCKS = {
    "q2_K": [("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")],
    "q3_K": [("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")],
    "q4_K": [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)],
    "q5_K": [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)],
    "q6_K": [("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")],
}


def _two_bit_planes(qs, np):
    """q2_K/q3_K's low bits: each half of 128 values reads 32 bytes four times, 2 bits deeper each time;
    within one pass bytes 0-15 give one 16-value sub-block and bytes 16-31 the next.
    Result [blocks, 256] in value order, values 0-3."""
    planes = qs.reshape(-1, 2, 1, 2, 16) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1, 1)
    return (planes & 3).reshape(-1, 256)


def _scales_mins_6bit(s, np):
    """q4_K/q5_K: eight 6-bit (scale, min) pairs in 12 bytes. Pairs 0-3: low 6 bits of bytes 0-3
    (scales) and 4-7 (mins). Pairs 4-7: bytes 8-11 give the low 4 bits (scale in the low nibble,
    min in the high one); the top 2 bits of bytes 0-3 and 4-7 give their bits 4-5."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def dequantize_k(tname, raw):
    """k-quant super-blocks to a flat float32 array, as ggml's dequantize_row_q*_K: the same float32
    operations in the same order (fp16 scale times the sub-block's integer scale, times the quant,
    minus fp16 dmin times the integer min where the type has one), so the bits equal ggml's."""
    import numpy as np
    b = raw.view(np.dtype(K_BLOCKS[tname]))
    d = b["d"].astype(np.float32)[:, None]
    if tname == "q2_K":
        # 16 sub-blocks of 16: scale in the low nibble, min in the high one; value = d*sc*q - dmin*m.
        sc = b["scales"]
        step = np.repeat(d * (sc & 0x0F).astype(np.float32), 16, axis=1)
        low = np.repeat(b["dmin"].astype(np.float32)[:, None] * (sc >> 4).astype(np.float32), 16, axis=1)
        return (step * _two_bit_planes(b["qs"], np).astype(np.float32) - low).reshape(-1)
    if tname == "q3_K":
        # 16 signed 6-bit scales (stored + 32): low 4 bits are the nibbles of bytes 0-7 (low nibbles
        # for sub-blocks 0-7, high for 8-15), bits 4-5 come from bytes 8-11, 2 bits per group of four.
        s = b["scales"]
        j = np.arange(16)
        low4 = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
        top2 = (s[:, 8 + j % 4] >> (2 * (j // 4)).astype(np.uint8)) & 3
        sc = (low4 | (top2 << 4)).astype(np.int32) - 32
        step = np.repeat(d * sc.astype(np.float32), 16, axis=1)
        # The third bit is in hmask: value l of pass p (p = 0..7 over both halves) is bit p of byte l % 32;
        # a clear bit means the quant is 4 lower.
        bit = (b["hmask"].reshape(-1, 1, 1, 2, 16) >> np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1, 1)) & 1
        q = _two_bit_planes(b["qs"], np).astype(np.int32) - 4 * (1 - bit.reshape(-1, 256).astype(np.int32))
        return (step * q.astype(np.float32)).reshape(-1)
    if tname in ("q4_K", "q5_K"):
        # 8 sub-blocks of 32: each 32 bytes of qs hold two sub-blocks (low nibbles, then high nibbles).
        sc, mn = _scales_mins_6bit(b["scales"], np)
        q = (b["qs"].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
        if tname == "q5_K":
            # Bit s of qh byte l is the fifth bit of value l of sub-block s.
            fifth = (b["qh"].reshape(-1, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)) & 1
            q = q | (fifth << 4)
        step = np.repeat(d * sc, 32, axis=1)
        low = np.repeat(b["dmin"].astype(np.float32)[:, None] * mn, 32, axis=1)
        return (step * q.reshape(-1, 256).astype(np.float32) - low).reshape(-1)
    # q6_K: 16 sub-blocks of 16 with int8 scales. Each half of 128 values takes 64 bytes of ql (low
    # 4 bits: quarters 0 and 1 from the low nibbles of bytes 0-31 and 32-63, quarters 2 and 3 from
    # their high nibbles) and 32 bytes of qh (2 bits per quarter, quarter k at bits 2k-2k+1).
    low4 = (b["ql"].reshape(-1, 2, 1, 2, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1, 1)) & 0x0F
    top2 = (b["qh"].reshape(-1, 2, 1, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 2, 2, 1)) & 3
    q = (low4 | (top2 << 4)).reshape(-1, 256).astype(np.int32) - 32
    step = np.repeat(d * b["scales"].astype(np.float32), 16, axis=1)
    return (step * q.astype(np.float32)).reshape(-1)
