"""What the tests of exports run through the tool share (gguf_images.py, q8_export.py): the tiny
checkpoint and its sizes, export_model.py in a subprocess, sd-txt2img (SD_TXT2IMG) making two
64x64 pictures, and the parts of a PNG they compare."""

import os
import re
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(REPO, "tests", "fixtures")
GGUF = os.path.normpath(os.path.join(REPO, "..", "shared", "conformance", "gguf"))
TINY = os.path.join(FIX, "tiny", "tiny.safetensors")
TINY_ARGS = ["--config", os.path.join(FIX, "tiny", "v1-tiny.yaml"),
             "--text-config", os.path.join(FIX, "tiny", "text_encoder.json")]


def export(checkpoint, out, *extra):
    """export_model.py CHECKPOINT --out OUT with the tiny model's sizes: the CompletedProcess."""
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "export_model.py"), checkpoint, "--out", out,
                           *TINY_ARGS, *extra], capture_output=True, text=True, timeout=600)


def run_tool(model, parent, *extra, seed, prompt):
    """sd-txt2img on `model`: 2 pictures of 64x64 in 4 steps, into a new folder in `parent`.
    (the CompletedProcess, that folder)."""
    outdir = tempfile.mkdtemp(dir=parent)
    r = subprocess.run([os.environ["SD_TXT2IMG"], "--model", model, "--outdir", outdir, "--quiet",
                        "--threads", "1", "--H", "64", "--W", "64", "--steps", "4", "--seed", str(seed),
                        "--n_samples", "2", "--prompt", prompt, *extra],
                       capture_output=True, text=True, timeout=600)
    return r, outdir


def two_pictures(test, model, parent, *extra, seed, prompt):
    """run_tool's two PNG files' bytes, in name order; `test` (a TestCase) fails unless the run
    ended with status 0 and wrote exactly two files."""
    r, outdir = run_tool(model, parent, *extra, seed=seed, prompt=prompt)
    test.assertEqual(r.returncode, 0, r.stderr)
    names = sorted(os.listdir(outdir))
    test.assertEqual(len(names), 2, names)
    out = []
    for n in names:
        with open(os.path.join(outdir, n), "rb") as f:
            out.append(f.read())
    return out


def pixel_data(png):
    """The IDAT chunks' bytes."""
    out, i = b"", 8
    while i + 8 <= len(png):
        n = struct.unpack(">I", png[i:i + 4])[0]
        if png[i + 4:i + 8] == b"IDAT":
            out += png[i + 8:i + 8 + n]
        i += 12 + n
    return out


def without_source_hash(png):
    """The PNG's chunks in order, the parameters text without its "Model hash" (the
    checkpoint file's own hash, which differs between two files of the same weights)."""
    out, i = [], 8
    while i + 8 <= len(png):
        n = struct.unpack(">I", png[i:i + 4])[0]
        kind, data = png[i + 4:i + 8], png[i + 8:i + 8 + n]
        if kind != b"IDAT":
            data = re.sub(rb"Model hash: [0-9a-f]{10}, ", b"", data)
        out.append((kind, data))
        i += 12 + n
    return out
