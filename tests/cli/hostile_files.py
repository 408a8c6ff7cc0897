"""Writes the crafted files of tests/cli/test_hostile_files.cpp (issue 32) into
the folder given: each small on disk, each standing for gigabytes or hours if a
reader trusted it. Run with /usr/bin/python3 (Debian's python3-torch):
    hostile_files.py OUT FIXTURES [NAME...]     (no NAME: all of them)"""
import io
import json
import struct
import sys
import zipfile
from pathlib import Path

import torch

out = Path(sys.argv[1])
fixtures = Path(sys.argv[2])
names = set(sys.argv[3:])


def want(name):
    return not names or name in names


def saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rezip(data, replace, path):
    """The torch.save archive `data` with the records of `replace` (name suffix -> writer) rewritten, deflated."""
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            suffix = next((s for s in replace if info.filename.endswith(s)), None)
            if suffix is None:
                dst.writestr(info, src.read(info.filename))
            else:
                record = zipfile.ZipInfo(info.filename)
                record.compress_type = zipfile.ZIP_DEFLATED
                record._compresslevel = 1
                with dst.open(record, "w", force_zip64=True) as f:
                    replace[suffix](f)


# A stride-0 view: 823 bytes that stand for 2 GiB of floats.
expanded = torch.zeros(1).expand(1 << 24, 32)
if want("stride0.pt"):
    (out / "stride0.pt").write_bytes(saved({"string_to_param": {"*": expanded}}))
if want("stride0.pth"):
    (out / "stride0.pth").write_bytes(saved({"1.weight": expanded}))
if want("stride0.ckpt"):
    (out / "stride0.ckpt").write_bytes(saved({"state_dict": {"decoder.conv_in.weight": expanded}}))

# A deflated 1 GiB record where the pickle's storage holds 64 floats.
def gigabyte(f):
    chunk = bytes(64 << 20)
    for _ in range(16):
        f.write(chunk)
if want("big_record.pt"):
    rezip(saved({"string_to_param": {"*": torch.zeros(2, 32)}}), {"/data/0": gigabyte}, out / "big_record.pt")

# A pickle of 3 million ')' '0' opcodes (6 MB, deflated to a few KB).
if want("opcodes.pt"):
    rezip(saved({"string_to_param": {"*": torch.zeros(2, 32)}}),
          {"/data.pkl": lambda f: f.write(b"\x80\x02" + b")0" * 3_000_000 + b"}.")}, out / "opcodes.pt")

# 2000 views of one 1 MiB storage (a few KB of file): 2 GB when each is copied.
if want("views.pth"):
    base = torch.zeros(1 << 18)
    (out / "views.pth").write_bytes(saved({"%d.weight" % i: base[i:] for i in range(2000)}))


def safetensors(tensors, path):
    if not want(Path(path).name):
        return
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + blob)


nan = struct.pack("<f", float("nan"))
safetensors({"emb_params": ("F32", [1, 32], nan * 32)}, out / "nan_emb.safetensors")
safetensors({"BREAK": ("F32", [32], bytes(128))}, out / "break_key.safetensors")
safetensors({"x(y)": ("F32", [32], bytes(128))}, out / "paren_key.safetensors")

# lora_a with every byte of its down and up tensors 0xff (NaN in F16 and F32
# alike), its alphas kept: the tensors are read when the stage loads.
if want("nan_lora.safetensors"):
    raw = bytearray((fixtures / "lora" / "lora_a.safetensors").read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    for name, e in json.loads(raw[8:8 + n]).items():
        if name.endswith(".weight"):
            begin, end = e["data_offsets"]
            raw[8 + n + begin:8 + n + end] = b"\xff" * (end - begin)
    (out / "nan_lora.safetensors").write_bytes(bytes(raw))
