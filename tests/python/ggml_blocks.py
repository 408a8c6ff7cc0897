"""Every block type the export reads, against ggml's own arithmetic: tests/data/ggml-blocks/ holds, per
type, blocks of random bytes and ggml's to_float of them, and ggml's reference quantizer's blocks with
their to_float (see its README). gguf_io must give the same float32 bits. The k-quants also go through
export_model.py --unet-gguf, and their malformed tensors are refused with one line."""

import os
import tempfile
import unittest

import numpy as np
import torch

import gguf_export as ge
import gguf_writer as gw
from sd_export.gguf_io import INT_TYPES, READ_TYPES, GgufFile
from sd_export.safetensors_io import SafetensorsFile, read_tensors
from tool_runs import REPO

BLOCKS = os.path.join(REPO, "tests", "data", "ggml-blocks")
K_QUANTS = ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
# The tiny UNet's one weight whose rows are whole super-blocks of 256; the k-quant files hold ggml's
# quantization of it.
FF2 = ge.UNET + "middle_block.1.transformer_blocks.0.ff.net.2.weight"
FF2_IN_DATA = "tiny_unet.ff.net.2.weight"  # ggml limits names to 63 bytes


def block_file(tname):
    return os.path.join(BLOCKS, tname + ".gguf")


def raw_bytes(g, key):
    """A tensor's stored bytes, as the file has them."""
    _, _, begin, nbytes = g.entries[key]
    return bytes(g.map[begin:begin + nbytes])


class GgmlToFloat(unittest.TestCase):
    """gguf_io's expansion equals ggml's to_float bit for bit, for every stored type it reads."""

    def test_every_read_type_has_ggml_data(self):
        # f32, f64 and the integer types are read as stored; every other read type is checked below.
        converted = {name for name, _, _ in READ_TYPES.values() if name not in INT_TYPES and name not in ("f32", "f64")}
        have = {f[:-len(".gguf")] for f in os.listdir(BLOCKS) if f.endswith(".gguf")}
        self.assertEqual(converted, have)
        self.assertTrue(set(K_QUANTS) <= converted)

    def check(self, tname, key):
        with GgufFile(block_file(tname)) as g:
            self.assertEqual(g.dtype_name(key), tname)
            self.assertEqual(g.dtype_name(key + ".to_float"), "f32")
            got = g.load(key).float()
            want = g.load(key + ".to_float")
        self.assertEqual(got.dtype, torch.float32)
        self.assertEqual(tuple(got.shape), tuple(want.shape))
        self.assertGreaterEqual(got.numel(), 256)
        mismatch = (ge.bits(got) != ge.bits(want)).sum().item()
        self.assertEqual(mismatch, 0, f"{tname} {key}: {mismatch} of {got.numel()} values differ from ggml's")
        return got

    def test_random_blocks(self):
        for tname in sorted(os.listdir(BLOCKS)):
            if tname.endswith(".gguf"):
                with self.subTest(type=tname[:-5]):
                    got = self.check(tname[:-5], "random_blocks")
                    # Random quants and scales give many distinct values: the comparison is not of zeros.
                    self.assertGreater(len(torch.unique(got[torch.isfinite(got)])), got.numel() // 8)

    def test_reference_quantizer_blocks(self):
        for tname in sorted(os.listdir(BLOCKS)):
            if tname.endswith(".gguf"):
                with self.subTest(type=tname[:-5]):
                    got = self.check(tname[:-5], "quantized")
                    with GgufFile(block_file(tname[:-5])) as g:
                        source = g.load("source")
                    # ggml quantized these floats: the expansion is near them (a check of the data, not exactness).
                    self.assertLess((got - source).abs().max().item(), 0.6 * source.abs().max().item())

    def test_f16_every_bit_pattern(self):
        with GgufFile(block_file("f16")) as g:
            stored = g.load("random_blocks")
        self.assertEqual(stored.dtype, torch.float16)
        self.assertTrue(torch.equal(stored.view(torch.int16).reshape(-1).to(torch.int32) & 0xFFFF,
                                    torch.arange(65536, dtype=torch.int32)))


class KQuantFiles(unittest.TestCase):
    """k-quant tensors through the whole export: export_model.py CHECKPOINT --unet-gguf FILE."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        with SafetensorsFile(ge.TINY) as f:
            cls.unet = {k: f.load(k) for k in f.keys() if k.startswith(ge.UNET)}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def unet_gguf(self, tname):
        """The tiny UNet as sd.cpp's converter would write it at this type: ff.net.2.weight as ggml's
        tname blocks (from the data file), every other tensor f32."""
        with GgufFile(block_file(tname)) as g:
            self.assertEqual(g.shape(FF2_IN_DATA), tuple(self.unet[FF2].shape))
            blocks = gw.Tensor(FF2, g.shape(FF2_IN_DATA), tname, raw_bytes(g, FF2_IN_DATA))
            expanded = g.load(FF2_IN_DATA)
        tensors = [blocks if k == FF2 else gw.f32_tensor(k, v.numpy()) for k, v in self.unet.items()]
        path = os.path.join(self.tmp.name, f"unet-{tname}.gguf")
        with open(path, "wb") as f:
            f.write(gw.build(tensors))
        return path, expanded

    def test_export_from_k_quant_unet(self):
        for tname in K_QUANTS:
            with self.subTest(type=tname):
                path, expanded = self.unet_gguf(tname)
                out = os.path.join(self.tmp.name, "out-" + tname)
                rc, lines = ge.run_export([ge.TINY, "--unet-gguf", path, "--out", out, *ge.TINY_ARGS])
                self.assertEqual(rc, 0, lines)
                got = read_tensors(os.path.join(out, "unet.weights"))
                key = FF2[len(ge.UNET):]
                # The quantized weight is ggml's blocks expanded (checked against ggml above), not the checkpoint's.
                self.assertTrue(torch.equal(ge.bits(got[key].float()), ge.bits(expanded)), tname)
                self.assertFalse(torch.equal(got[key].float(), self.unet[FF2]), tname)
                self.assertLess((got[key].float() - self.unet[FF2]).abs().max().item(),
                                self.unet[FF2].abs().max().item())
                for k, v in self.unet.items():
                    if k != FF2:
                        self.assertTrue(torch.equal(got[k[len(ge.UNET):]], v), k)

    def refused(self, data, name, *words):
        path = os.path.join(self.tmp.name, name)
        with open(path, "wb") as f:
            f.write(data)
        out = os.path.join(self.tmp.name, name + ".out")
        rc, lines = ge.run_export([path, "--out", out, *ge.TINY_ARGS])
        self.assertEqual(rc, 1, lines)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn(path, lines[0])
        for w in words:
            self.assertIn(w, lines[0])
        self.assertFalse(os.path.exists(out))

    def test_partial_super_block_refused(self):
        for tname in K_QUANTS:
            with self.subTest(type=tname), GgufFile(block_file(tname)) as g:
                raw = raw_bytes(g, "random_blocks")
                # Rows of 128 values: the same bytes, but half a super-block a row.
                t = gw.Tensor("w", [8, 128], tname, raw)
                self.refused(gw.build([t]), f"half-{tname}.gguf", "'w'", "whole blocks of 256")

    def test_quantized_scalar_refused(self):
        # No dimensions is one value (as ggml reads it): not a whole block of any quantized type.
        for tname, block in (("q8_0", 32), ("q6_K", 256)):
            with self.subTest(type=tname):
                t = gw.Tensor("s", [], tname, b"")
                self.refused(gw.build([gw.f32_tensor("a", np.zeros(2, np.float32)), t]), f"scalar-{tname}.gguf",
                             "'s'", f"rows of 1 values are not whole blocks of {block}")

    def test_truncated_k_quant_data_refused(self):
        for tname in K_QUANTS:
            with self.subTest(type=tname), GgufFile(block_file(tname)) as g:
                raw = raw_bytes(g, "random_blocks")
                data = gw.build([gw.Tensor("w", [2, 512], tname, raw)])
                self.refused(data[:-len(raw) // 4], f"cut-{tname}.gguf", "'w'", "ends past")


if __name__ == "__main__":
    unittest.main()
