#!/usr/bin/python3
"""A fuzz campaign over the export's GGUF reader (python/sd_export/gguf_io.py), which is Python:
libFuzzer cannot drive it here (no atheris in Debian 12), so this is the nearest thing.

Each input is made from a seed (the fixture files in ../shared/conformance/gguf and small files
built here: every value type, every tensor type, several alignments) by byte mutation (bit flips,
interesting 4- and 8-byte values written over the header's counts, lengths, dimensions, types
and offsets, truncation, inserted or deleted bytes, splices of two seeds), or built whole from
random choices. The reader opens it, and where it parses, every tensor is loaded (expanded to
float32) and its q8_0 blocks taken. The outcome must be either success or the reader's own
error (ExportError) in one line; anything else (another exception, an input that takes more
than --max-seconds, the process growing past --max-rss-mb) is a finding: the input is written
to --crashes and the campaign ends with status 1.

  tests/fuzz/fuzz_gguf.py [--seconds 600] [--seed N] [--crashes DIR]
"""

import argparse
import os
import random
import resource
import struct
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

from gguf_writer import Tensor, build, f32_tensor, gstr, kv_string, kv_uint32  # noqa: E402
from sd_export.gguf_io import READ_TYPES, GgufFile  # noqa: E402
from sd_export.report import ExportError  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(REPO, "..", "shared", "conformance", "gguf"))
INTERESTING_32 = [0, 1, 2, 3, 4, 7, 8, 9, 12, 24, 30, 31, 32, 33, 63, 64, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF,
                  0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
INTERESTING_64 = INTERESTING_32 + [2 ** 32, 2 ** 40, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64 - 32]


def block_bytes(tname, blocks, rng):
    return bytes(rng.getrandbits(8) for _ in range(blocks * READ_TYPES_BY_NAME[tname][2]))


READ_TYPES_BY_NAME = {v[0]: (k,) + v[1:] for k, v in READ_TYPES.items()}


def random_kv(rng, i):
    key = f"k.{i}" if rng.random() < 0.9 else "general.alignment"
    vtype = rng.choice(range(13))
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == 8:
        return out + gstr("v" * rng.randrange(5))
    if vtype == 9:
        etype = rng.choice([0, 4, 6, 8, 10, 12])
        n = rng.randrange(4)
        out += struct.pack("<IQ", etype, n)
        if etype == 8:
            return out + b"".join(gstr("s") for _ in range(n))
        size = {0: 1, 4: 4, 6: 4, 10: 8, 12: 8}[etype]
        return out + bytes(n * size)
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[vtype]
    return out + (struct.pack("<I", 32) if vtype == 4 and key == "general.alignment" else bytes(size))


def random_file(rng):
    """A small valid file (or nearly: a few fields drawn past their limits)."""
    tensors = []
    for i in range(rng.randrange(5)):
        tname = rng.choice(list(READ_TYPES_BY_NAME))
        block = READ_TYPES_BY_NAME[tname][1]
        dims = [rng.choice([1, 2, 3]) for _ in range(rng.randrange(0, 4))] + [block * rng.choice([1, 2])]
        blocks = 1
        for d in dims:
            blocks *= d
        blocks //= block
        tensors.append(Tensor(f"t{i}", dims, "f32", block_bytes(tname, blocks, rng)))
        tensors[-1].type_id = READ_TYPES_BY_NAME[tname][0]
    if rng.random() < 0.3:
        tensors.append(f32_tensor("model.diffusion_model.x.weight", [[1.0] * 32] * 2))
    kvs = [random_kv(rng, i) for i in range(rng.randrange(4))]
    return build(tensors, kvs, alignment=rng.choice([32, 32, 64, 8]), version=rng.choice([3, 3, 2]))


def small_seeds():
    rng = random.Random(1)
    seeds = [random_file(rng) for _ in range(24)]
    seeds.append(build([f32_tensor("a", [[1.0, 2.0]])], [kv_uint32("general.alignment", 64), kv_string("x", "y")],
                       alignment=64))
    return seeds


def fixture_seeds():
    """The fixture files, whole (up to 15 MB: drawn for one input in twenty, so that most
    inputs are small and many are tried a second)."""
    seeds = []
    if not os.path.isdir(FIXTURES):
        return seeds
    for name in sorted(os.listdir(FIXTURES)):
        if name.endswith(".gguf"):
            with open(os.path.join(FIXTURES, name), "rb") as f:
                data = f.read()
            seeds.append(data)  # whole, drawn rarely
    return seeds


def mutate(data, rng, seeds):
    data = bytearray(data)
    head = min(len(data), 64 * 1024)  # the header and tensor infos are at the front
    for _ in range(rng.choice([1, 1, 2, 3, 6])):
        op = rng.randrange(9)
        pos = rng.randrange(head) if head else 0
        if not data:
            data += bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
        elif op == 0:
            data[pos % len(data)] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos % len(data)] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.getrandbits(8)])
        elif op == 2 and pos + 4 <= len(data):
            data[pos:pos + 4] = struct.pack("<I", rng.choice(INTERESTING_32))
        elif op == 3 and pos + 8 <= len(data):
            data[pos:pos + 8] = struct.pack("<Q", rng.choice(INTERESTING_64))
        elif op == 4:
            del data[rng.randrange(len(data)):]  # truncate
        elif op == 5:
            del data[pos:pos + rng.randrange(1, 16)]
        elif op == 6:
            data[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16)))
        elif op == 7:
            other = rng.choice(seeds)
            at = rng.randrange(len(other)) if other else 0
            data[pos:pos + 32] = other[at:at + 32]
        elif op == 8 and len(data) >= 24:
            # The counts right after the magic and version: the likeliest fields to matter.
            at = rng.choice([4, 8, 16])
            width = 4 if at == 4 else 8
            data[at:at + width] = struct.pack("<I" if width == 4 else "<Q",
                                              rng.choice(INTERESTING_32 if width == 4 else INTERESTING_64))
    return bytes(data)


def exercise(path):
    """What the export does with a file: parse, then read every tensor."""
    with GgufFile(path) as g:
        for key in list(g.keys()):
            g.shape(key)
            g.is_float(key)
            g.dtype_name(key)
            g.load(key)
            g.q8_0_blocks(key)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--crashes", default=os.path.join(tempfile.gettempdir(), "fuzz_gguf_crashes"))
    p.add_argument("--max-seconds", type=float, default=10.0, help="one input's limit")
    p.add_argument("--max-rss-mb", type=float, default=2048.0)
    args = p.parse_args()
    warnings.simplefilter("ignore")  # NaN scales multiply to NaN: a value, not a fault (as in the export)
    import numpy  # noqa: F401 - imported once here, not inside the first input's time
    import torch  # noqa: F401
    rng = random.Random(args.seed)
    small, big = small_seeds(), fixture_seeds()
    seeds = small + big
    start = time.time()
    execs, parsed, refused, slowest, findings = 0, 0, 0, 0.0, 0
    corpus = list(small)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        path = os.path.join(tmp, "input.gguf")
        while time.time() - start < args.seconds:
            r = rng.random()
            if r < 0.15:
                data = random_file(rng)
            elif r < 0.2 and big:
                data = mutate(rng.choice(big), rng, seeds)
            else:
                data = mutate(rng.choice(corpus), rng, seeds)
            with open(path, "wb") as f:
                f.write(data)
            t0 = time.time()
            outcome = None
            try:
                exercise(path)
                parsed += 1
                if len(data) < 64 * 1024 and len(corpus) < 2000:
                    corpus.append(data)  # a valid variant: mutate it further
            except ExportError as e:
                refused += 1
                if "\n" in str(e) or not str(e).startswith((path, "cannot read " + path)):
                    outcome = f"ExportError not one line naming the file: {e!s:.300}"
            except Exception:  # noqa: BLE001 - any other exception is what the campaign looks for
                outcome = traceback.format_exc()
            took = time.time() - t0
            slowest = max(slowest, took)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            if outcome is None and took > args.max_seconds:
                outcome = f"took {took:.1f} s"
            if outcome is None and rss > args.max_rss_mb:
                outcome = f"peak RSS {rss:.0f} MB"
            execs += 1
            if outcome is not None:
                findings += 1
                os.makedirs(args.crashes, exist_ok=True)
                name = os.path.join(args.crashes, f"finding-{findings}.gguf")
                with open(name, "wb") as f:
                    f.write(data)
                print(f"fuzz_gguf: finding {findings} ({name}):\n{outcome}", flush=True)
                if findings >= 5:
                    break
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"fuzz_gguf: seed {args.seed}, {time.time() - start:.0f} s, {execs} executions "
          f"({execs / max(time.time() - start, 1e-9):.1f}/s), {parsed} parsed and read, {refused} refused in one "
          f"line, {findings} findings, slowest input {slowest:.2f} s, peak RSS {rss:.0f} MB, "
          f"{len(big)} fixture seeds, corpus {len(corpus)}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
