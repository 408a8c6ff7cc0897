"""GGUF files in the export (sd_export/gguf_io.py, --unet-gguf): the shared fixture's files
read as ggml's own to_float expands them, bit for bit; each block type against a plain
per-value reading of its layout; hostile files refused with one line."""

import contextlib
import io
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

import gguf_writer as gw
from sd_export.cli import main as export_main
from sd_export.gguf_io import GgufFile
from sd_export.safetensors_io import SafetensorsFile, read_tensors
from tool_runs import GGUF as SHARED_GGUF
from tool_runs import REPO, TINY, TINY_ARGS

UNET = "model.diffusion_model."


def bits(t):
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def run_export(argv):
    """export_model.py's main() in this process: (exit status, stderr lines)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = export_main(argv)
    return rc, err.getvalue().strip().splitlines()


class FixtureFiles(unittest.TestCase):
    """Every tensor of the fixture's GGUF files equals ggml's to_float (the .dequant file) or,
    stored as f32, the checkpoint's own bytes."""

    @unittest.skipUnless(os.path.isdir(SHARED_GGUF), "no ../shared/conformance/gguf next to the checkout")
    def test_tensors_equal_ggml_to_float(self):
        tiny = read_tensors(TINY)
        files = sorted(f for f in os.listdir(SHARED_GGUF) if f.endswith(".gguf"))
        self.assertGreaterEqual(len(files), 4)
        for name in files:
            stem = os.path.join(SHARED_GGUF, name[:-len(".gguf")])
            ref = read_tensors(stem + ".dequant.safetensors")
            with open(stem + ".types.tsv") as f:
                types = dict(line.split("\t")[:2] for line in f if line.strip())
            with self.subTest(file=name), GgufFile(os.path.join(SHARED_GGUF, name)) as g:
                self.assertEqual(set(g.keys()), set(types))
                expanded = 0
                for key in g.keys():
                    self.assertEqual(g.dtype_name(key), types[key], key)
                    got = g.load(key).float()
                    want = ref[key] if key in ref else tiny[key]
                    self.assertEqual(tuple(got.shape), tuple(want.shape), key)
                    self.assertTrue(torch.equal(bits(got), bits(want)), f"{name}: {key} differs")
                    expanded += key in ref
                self.assertEqual(expanded, len(ref))


def random_fp16(rng, n):
    """Finite fp16 scales of both signs, tiny (subnormal) to large."""
    return (rng.standard_normal(n) * np.exp2(rng.integers(-20, 8, n))).astype(np.float16)


class BlockLayouts(unittest.TestCase):
    """Each block type read by gguf_io against its layout read value by value (the README's rules)."""

    def expand(self, tname, raw, count):
        t = gw.Tensor("w", [count // 32, 32], tname, raw)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "b.gguf")
            with open(path, "wb") as f:
                f.write(gw.build([t]))
            with GgufFile(path) as g:
                return g.load("w").float().reshape(-1).numpy()

    def check(self, tname, make_block, value):
        """make_block(rng) -> (bytes, fields); value(fields, j) -> the j-th float32 of the block."""
        rng = np.random.default_rng(7)
        blocks = [make_block(rng) for _ in range(64)]
        got = self.expand(tname, b"".join(b for b, _ in blocks), 32 * len(blocks))
        want = np.array([value(fields, j) for _, fields in blocks for j in range(32)], dtype=np.float32)
        self.assertEqual(got.dtype, np.float32)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32), tname)
        return got

    def test_q8_0(self):
        def block(rng):
            d, q = random_fp16(rng, 1)[0], rng.integers(-128, 128, 32).astype(np.int8)
            return d.tobytes() + q.tobytes(), (d, q)
        self.check("q8_0", block, lambda f, j: np.float32(f[0]) * np.float32(f[1][j]))

    @staticmethod
    def nibbles(qs, j):
        return int(qs[j]) & 0x0F if j < 16 else int(qs[j - 16]) >> 4

    def test_q4_0(self):
        def block(rng):
            d, qs = random_fp16(rng, 1)[0], rng.integers(0, 256, 16).astype(np.uint8)
            return d.tobytes() + qs.tobytes(), (d, qs)
        self.check("q4_0", block, lambda f, j: np.float32(f[0]) * np.float32(self.nibbles(f[1], j) - 8))

    def test_q4_1(self):
        def block(rng):
            (d, m), qs = random_fp16(rng, 2), rng.integers(0, 256, 16).astype(np.uint8)
            return d.tobytes() + m.tobytes() + qs.tobytes(), (d, m, qs)
        self.check("q4_1", block, lambda f, j: np.float32(f[0]) * np.float32(self.nibbles(f[2], j)) + np.float32(f[1]))

    @staticmethod
    def fifth(qh, j):
        return ((qh >> j) & 1) << 4

    def test_q5_0(self):
        def block(rng):
            d, qh, qs = random_fp16(rng, 1)[0], int(rng.integers(0, 2**32)), rng.integers(0, 256, 16).astype(np.uint8)
            return d.tobytes() + struct.pack("<I", qh) + qs.tobytes(), (d, qh, qs)
        self.check("q5_0", block, lambda f, j: np.float32(f[0])
                   * np.float32((self.nibbles(f[2], j) | self.fifth(f[1], j)) - 16))

    def test_q5_1(self):
        def block(rng):
            (d, m), qh = random_fp16(rng, 2), int(rng.integers(0, 2**32))
            qs = rng.integers(0, 256, 16).astype(np.uint8)
            return d.tobytes() + m.tobytes() + struct.pack("<I", qh) + qs.tobytes(), (d, m, qh, qs)
        self.check("q5_1", block, lambda f, j: np.float32(f[0])
                   * np.float32(self.nibbles(f[3], j) | self.fifth(f[2], j)) + np.float32(f[1]))

    def test_f16_and_bf16(self):
        rng = np.random.default_rng(3)
        halves = random_fp16(rng, 64)
        got = self.expand("f16", halves.tobytes(), 64)
        np.testing.assert_array_equal(got.astype(np.float32), halves.astype(np.float32))
        words = rng.integers(0, 2**16, 64).astype(np.uint16)
        words[(words & 0x7F80) == 0x7F80] = 0x3F80  # no inf/NaN
        got = self.expand("bf16", words.tobytes(), 64)
        want = (words.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def valid_tensors():
    """Two small tensors: an f32 [2, 3] and a q8_0 [2, 32]."""
    q8 = b"".join(np.float16(0.5).tobytes() + np.arange(-16, 16, dtype=np.int8).tobytes() for _ in range(2))
    return [gw.f32_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3)), gw.Tensor("b", [2, 32], "q8_0", q8)]


class HostileFiles(unittest.TestCase):
    """Bad GGUF files given to export_model.py: exit status 1 and one line naming the file."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def refused(self, data, *words, name="hostile.gguf"):
        path = os.path.join(self.tmp.name, name)
        with open(path, "wb") as f:
            f.write(data)
        rc, lines = run_export([path, "--out", os.path.join(self.tmp.name, "out"), *TINY_ARGS])
        self.assertEqual(rc, 1, lines)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn(path, lines[0])
        for w in words:
            self.assertIn(w, lines[0])
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "out")))
        return lines[0]

    def test_valid_file_reads(self):
        # The base of the cases below is itself readable: the refusals are the mutations'.
        path = os.path.join(self.tmp.name, "valid.gguf")
        with open(path, "wb") as f:
            f.write(gw.build(valid_tensors(), [gw.kv_string("general.name", "x")]))
        with GgufFile(path) as g:
            self.assertEqual(g.load("a").tolist(), [[0, 1, 2], [3, 4, 5]])
            self.assertEqual(g.load("b")[1, :3].tolist(), [-8.0, -7.5, -7.0])

    def test_truncated(self):
        data = gw.build(valid_tensors(), [gw.kv_string("general.name", "x")])
        # In the header, the key-value, the tensor infos, and the last tensor's data.
        for cut in (3, 12, 30, 60, 120, len(data) - 40):
            with self.subTest(cut=cut):
                self.refused(data[:cut], "truncated", name=f"cut{cut}.gguf")

    def test_empty_file(self):
        self.refused(b"", "truncated")

    def test_not_gguf_magic_version(self):
        data = gw.build(valid_tensors())
        self.refused(data[:4] + struct.pack("<I", 1) + data[8:], "version 1")
        self.refused(data[:4] + struct.pack("<I", 99) + data[8:], "version 99")

    def test_huge_tensor_count(self):
        self.refused(gw.build(valid_tensors(), n_tensors=2**63), "9223372036854775808 tensors cannot fit")

    def test_huge_key_value_count(self):
        self.refused(gw.build(valid_tensors(), n_kv=2**62), "4611686018427387904 key-values cannot fit")

    def test_huge_string_length(self):
        bad_key = struct.pack("<Q", 2**62) + b"general.name"
        self.refused(gw.build(valid_tensors(), [bad_key]), "truncated")

    def test_huge_array_length(self):
        arr = gw.gstr("tokens") + struct.pack("<IIQ", 9, 8, 2**60)
        self.refused(gw.build(valid_tensors(), [arr]), "1152921504606846976 elements")

    def test_huge_dimensions(self):
        t = valid_tensors()
        t[0].shape = [2**40, 2**40, 2**40, 2**40]
        self.refused(gw.build(t), "ends past")

    def test_offset_past_the_end(self):
        t = valid_tensors()
        t[1].offset = 2**40
        self.refused(gw.build(t, fix_offsets=False), "'b'", "ends past")

    def test_unaligned_offset(self):
        t = valid_tensors()
        t[1].offset = 36
        self.refused(gw.build(t, fix_offsets=False), "'b'", "alignment")

    def test_unknown_type(self):
        t = valid_tensors()
        t[1].type_id = 99
        self.refused(gw.build(t), "'b'", "unknown ggml type 99")

    def test_unread_type_refused_by_name(self):
        t = valid_tensors()
        t[1].type_id = gw.TYPE_IDS["q8_K"]
        self.refused(gw.build(t), "'b'", "stored as q8_K", "q6_K")

    def test_duplicate_tensor_names(self):
        t = valid_tensors()
        t[1].name = "a"
        self.refused(gw.build(t), "'a' appears twice")

    def test_duplicate_keys(self):
        kvs = [gw.kv_string("general.name", "x"), gw.kv_string("general.name", "y")]
        self.refused(gw.build(valid_tensors(), kvs), "'general.name' appears twice")

    def test_too_many_dimensions(self):
        t = valid_tensors()
        t[0].shape = [1, 1, 1, 2, 3]
        self.refused(gw.build(t), "5 dimensions")

    def test_partial_blocks(self):
        t = valid_tensors()
        t[1].shape = [4, 16]
        self.refused(gw.build(t), "'b'", "whole blocks")

    def test_bad_alignment(self):
        self.refused(gw.build(valid_tensors(), [gw.kv_uint32("general.alignment", 3)]), "alignment 3")

    def test_unknown_value_type(self):
        self.refused(gw.build(valid_tensors(), [gw.gstr("k") + struct.pack("<I", 77)]), "unknown value type 77")

    def test_name_not_utf8(self):
        t = valid_tensors()
        t[0].name = b"\xff\xfe"
        self.refused(gw.build(t), "not UTF-8")

    def test_one_line_through_the_command(self):
        path = os.path.join(self.tmp.name, "cmd.gguf")
        with open(path, "wb") as f:
            f.write(gw.build(valid_tensors(), n_tensors=2**63))
        r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "export_model.py"), path, "--out",
                            os.path.join(self.tmp.name, "cmd-out")], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("cmd.gguf", r.stderr)


class UnetGguf(unittest.TestCase):
    """--unet-gguf: the UNet from a GGUF file, the rest from the checkpoint."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        with SafetensorsFile(TINY) as f:
            cls.unet = {k[len(UNET):]: f.load(k) for k in f.keys() if k.startswith(UNET)}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, tensors):
        path = os.path.join(self.tmp.name, name)
        with open(path, "wb") as f:
            f.write(gw.build(tensors))
        return path

    def export_unet(self, gguf):
        out = tempfile.mkdtemp(dir=self.tmp.name)
        rc, lines = run_export([TINY, "--unet-gguf", gguf, "--out", out, *TINY_ARGS])
        self.assertEqual(rc, 0, lines)
        return read_tensors(os.path.join(out, "unet.weights"))

    def test_bare_names(self):
        # ComfyUI-GGUF's names; the values offset so that the checkpoint's own UNet would not pass.
        path = self.write("bare.gguf", [gw.f32_tensor(k, v.numpy() + 1) for k, v in self.unet.items()])
        got = self.export_unet(path)
        self.assertEqual(set(got), set(self.unet))
        for k, v in self.unet.items():
            self.assertTrue(torch.equal(got[k], v + 1), k)

    @unittest.skipUnless(os.path.isdir(SHARED_GGUF), "no ../shared/conformance/gguf next to the checkout")
    def test_compvis_names_quantized(self):
        ref = read_tensors(os.path.join(SHARED_GGUF, "tiny-unet-q5_0.dequant.safetensors"))
        got = self.export_unet(os.path.join(SHARED_GGUF, "tiny-unet-q5_0.gguf"))
        for k, v in self.unet.items():
            want = ref.get(UNET + k, v)
            self.assertTrue(torch.equal(got[k], want), k)

    def test_both_names_refused(self):
        k, v = next(iter(self.unet.items()))
        path = self.write("both.gguf", [gw.f32_tensor(k, v.numpy()), gw.f32_tensor(UNET + k, v.numpy())])
        rc, lines = run_export([TINY, "--unet-gguf", path, "--out", os.path.join(self.tmp.name, "x"), *TINY_ARGS])
        self.assertEqual(rc, 1)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("twice", lines[0])

    def test_incomplete_unet_refused(self):
        items = list(self.unet.items())[1:]
        path = self.write("part.gguf", [gw.f32_tensor(k, v.numpy()) for k, v in items])
        rc, lines = run_export([TINY, "--unet-gguf", path, "--out", os.path.join(self.tmp.name, "y"), *TINY_ARGS])
        self.assertEqual(rc, 1)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("missing " + UNET + list(self.unet)[0], lines[0])

    def test_non_finite_values_refused(self):
        """A NaN in an f32 tensor, an infinite fp16 scale in a q8_0 block: one line naming the GGUF
        file and the tensor, exit 1 (they exported as NaN weights before)."""
        key = next(k for k, v in self.unet.items() if v.dim() == 2 and v.shape[1] % 32 == 0)
        rows, cols = self.unet[key].shape
        spoiled = self.unet[key].clone()
        spoiled[rows // 2, cols // 2] = float("nan")
        blocks = np.zeros(rows * cols // 32, dtype=[("d", "<f2"), ("qs", "i1", 32)])
        blocks["d"], blocks["qs"] = 0.01, 1
        blocks["d"][len(blocks) // 2] = np.inf
        for name, tensor in (("nan-f32.gguf", gw.f32_tensor(key, spoiled.numpy())),
                             ("inf-q8_0.gguf", gw.Tensor(key, (rows, cols), "q8_0", blocks.tobytes()))):
            with self.subTest(name):
                path = self.write(name, [tensor if k == key else gw.f32_tensor(k, v.numpy())
                                         for k, v in self.unet.items()])
                out = os.path.join(self.tmp.name, "out-" + name)
                rc, lines = run_export([TINY, "--unet-gguf", path, "--out", out, *TINY_ARGS])
                self.assertEqual(rc, 1, lines)
                self.assertEqual(len(lines), 1, lines)
                self.assertIn(f"{path}: its tensor {key!r} holds NaN or infinite values", lines[0])
                self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
