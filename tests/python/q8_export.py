"""8-bit model files (`export_model.py --dtype q8_0`, issue 37): what the UNet's weight file
holds, that the run keeps them (`--weights auto`) with the images of an fp32 export run with
`--weights q8`, that a q8_0 GGUF's blocks are copied as they are, and what the other
`--weights` and `--precision` choices do with them. Needs SD_TXT2IMG (the tool); the GGUF
cases need ../shared/conformance/gguf."""

import json
import os
import struct
import tempfile
import unittest

import numpy as np

import tool_runs
from sd_export.gguf_io import GgufFile
from sd_export.safetensors_io import SafetensorsFile, read_tensors, write_safetensors
from tool_runs import GGUF, REPO, TINY, pixel_data, without_source_hash
UNET_PREFIX = "model.diffusion_model."


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}


def cpu_has_bf16():
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


class Quantizer(unittest.TestCase):
    """sd_export/q8.py's quantize_q8_0 on the blocks at the edges of float32."""

    def test_blocks_too_small_for_a_reciprocal_are_zeros(self):
        # max|x| / 127 below the smallest normal float: 1 / d overflowed (a RuntimeWarning on the
        # export's stderr) and inf or NaN was cast to int8. Such a block is zeros with d = 0, as
        # the C++ quantize_q8_0 stores it (Q8Weights.BlocksTooSmallForAReciprocalAreZeros).
        import warnings

        import torch

        from sd_export.q8 import quantize_q8_0
        tiny = np.finfo(np.float32).tiny
        maxima = [1e-36, 1e-37, 1e-38, 1e-40, float(np.finfo(np.float32).smallest_subnormal)]
        w = torch.zeros(len(maxima) + 1, 32)
        for b, m in enumerate(maxima):
            w[b, 3], w[b, 7] = m, -m / 2
        w[-1, 0], w[-1, 1] = 127 * tiny, -63.5 * tiny  # the smallest normal scale: quantized as usual
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            q, d = quantize_q8_0(w)
        self.assertEqual(np.abs(q[:-1].astype(np.int32)).sum(), 0, q[:-1])
        self.assertTrue((d[:-1] == 0).all(), d)
        self.assertEqual((q[-1, 0], q[-1, 1]), (127, -64))


class Q8Files(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def export(cls, checkpoint, name, *extra):
        out = os.path.join(cls.tmp.name, name)
        if os.path.isdir(out):
            return out
        r = tool_runs.export(checkpoint, out, *extra)
        assert r.returncode == 0, r.stderr
        return out

    def run_tool(self, model, *extra):
        return tool_runs.run_tool(model, self.tmp.name, *extra, seed=5, prompt="a lighthouse at dusk")

    def images(self, model, *extra):
        return tool_runs.two_pictures(self, model, self.tmp.name, *extra, seed=5, prompt="a lighthouse at dusk")

    # ---------------------------------------------------------------- from a float checkpoint

    def test_unet_file_holds_int8_blocks_and_the_rest_float32(self):
        q8 = self.export(TINY, "q8", "--dtype", "q8_0")
        f32 = self.export(TINY, "f32")
        with open(os.path.join(q8, "model.json")) as f:
            self.assertEqual(json.load(f)["dtype"], "q8_0")
        h = header(os.path.join(q8, "unet.weights"))
        weights = {k for k, v in h.items() if v["dtype"] == "I8"}
        self.assertGreater(len(weights), 20)
        for k in weights:
            rows = h[k]["shape"][0]
            row = int(np.prod(h[k]["shape"][1:]))
            self.assertEqual(h[k + "_scale"]["dtype"], "F16", k)
            self.assertEqual(h[k + "_scale"]["shape"], [rows, row // 32], k)
        others = {k for k in h if k not in weights and not k.endswith(".weight_scale")}
        self.assertEqual({h[k]["dtype"] for k in others}, {"F32"})
        # Every weight of the fp32 export, the narrowable ones in 8 bits (3x3 conv_in: 36 a row, stays).
        self.assertEqual(weights | others, set(header(os.path.join(f32, "unet.weights"))))
        self.assertIn("input_blocks.0.0.weight", others)
        for stage in ("text_encoder", "vae_decoder", "vae_encoder"):
            with open(os.path.join(q8, stage + ".weights"), "rb") as a, \
                    open(os.path.join(f32, stage + ".weights"), "rb") as b:
                self.assertEqual(a.read(), b.read(), stage)
        self.assertLess(os.path.getsize(os.path.join(q8, "unet.weights")),
                        0.4 * os.path.getsize(os.path.join(f32, "unet.weights")))

    def test_q8_0_export_equals_fp32_export_run_with_weights_q8(self):
        q8 = self.export(TINY, "q8", "--dtype", "q8_0")
        f32 = self.export(TINY, "f32")
        got = self.images(q8)  # --weights auto: the 8-bit blocks as stored
        self.assertEqual(got, self.images(f32, "--weights", "q8"))
        self.assertEqual(got, self.images(q8, "--weights", "q8"))
        # The comparison can fail: fp32 weights give other pixels.
        self.assertNotEqual([pixel_data(p) for p in got], [pixel_data(p) for p in self.images(f32)])

    def test_other_weight_types_expand_the_blocks_at_load(self):
        q8 = self.export(TINY, "q8", "--dtype", "q8_0")
        held_q8 = self.images(q8, "--prepack", "off")
        # fp32: each layer's scale * q at load, the product the 8-bit layer makes as it runs.
        self.assertEqual(held_q8, self.images(q8, "--weights", "fp32", "--prepack", "off"))
        fp16 = self.images(q8, "--weights", "fp16")
        self.assertNotEqual([pixel_data(p) for p in fp16], [pixel_data(p) for p in held_q8])
        self.assertEqual(len(fp16), 2)
        if cpu_has_bf16():
            self.assertEqual(len(self.images(q8, "--precision", "bf16")), 2)
        r, outdir = self.run_tool(q8, "--precision", "bf16", "--weights", "q8")
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertEqual(os.listdir(outdir), [])

    def test_lora_merges_into_the_expanded_blocks(self):
        # Expanded to fp32, merged, narrowed again (--weights auto keeps q8); the LoRA shows.
        q8 = self.export(TINY, "q8", "--dtype", "q8_0")
        lora = os.path.join(REPO, "tests", "fixtures", "lora", "lora_a.safetensors")
        plain = self.images(q8)
        with_lora = self.images(q8, "--lora", lora)
        self.assertNotEqual([pixel_data(p) for p in with_lora], [pixel_data(p) for p in plain])
        self.assertNotEqual([pixel_data(p) for p in self.images(q8, "--lora", lora, "--weights", "fp32")],
                            [pixel_data(p) for p in with_lora])

    def test_damaged_8bit_file_is_refused_in_one_line(self):
        q8 = self.export(TINY, "q8", "--dtype", "q8_0")
        cases = {
            "no scales": lambda t: t.pop("output_blocks.0.0.emb_layers.1.weight_scale"),
            "scales as F32": lambda t: t.update({"output_blocks.0.0.emb_layers.1.weight_scale":
                                                 t["output_blocks.0.0.emb_layers.1.weight_scale"].float()}),
            "scales of another shape": lambda t: t.update({"output_blocks.0.0.emb_layers.1.weight_scale":
                                                           t["output_blocks.0.0.emb_layers.1.weight_scale"][:, :0]}),
            "I8 bias": lambda t: t.update({"out.0.bias": t["out.0.bias"].to(__import__("torch").int8)}),
        }
        tensors = read_tensors(os.path.join(q8, "unet.weights"))
        for what, change in cases.items():
            with self.subTest(what):
                bad = os.path.join(self.tmp.name, "bad-" + what.replace(" ", "-"))
                os.makedirs(bad)
                for name in os.listdir(q8):
                    if name != "unet.weights":
                        os.symlink(os.path.join(q8, name), os.path.join(bad, name))
                t = dict(tensors)
                change(t)
                write_safetensors(os.path.join(bad, "unet.weights"), sorted(t.items(), key=lambda kv:
                                                                           -kv[1].element_size()), align=64)
                r, outdir = self.run_tool(bad)
                self.assertEqual(r.returncode, 1, r.stderr)
                lines = r.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(os.path.join(bad, "unet.weights"), lines[0])
                self.assertTrue("output_blocks.0.0.emb_layers.1.weight" in lines[0] or "out.0.bias" in lines[0],
                                lines[0])

    # ---------------------------------------------------------------- from a q8_0 GGUF

    @unittest.skipUnless(os.path.isdir(GGUF), "no ../shared/conformance/gguf next to the checkout")
    def test_gguf_blocks_are_copied_as_they_are(self):
        out = self.export(os.path.join(GGUF, "tiny-q8_0.gguf"), "gguf-q8", "--dtype", "q8_0")
        stored = SafetensorsFile(os.path.join(out, "unet.weights"))
        copied = 0
        with GgufFile(os.path.join(GGUF, "tiny-q8_0.gguf")) as g:
            for key in g.keys():
                if not key.startswith(UNET_PREFIX) or g.dtype_name(key) != "q8_0" or len(g.shape(key)) < 2:
                    continue
                name = key[len(UNET_PREFIX):]
                self.assertEqual(stored.header[name]["dtype"], "I8", name)
                # The GGUF's bytes: blocks of an fp16 d and 32 int8 q.
                _, shape, begin, nbytes = g.entries[key]
                raw = np.frombuffer(g.map[begin:begin + nbytes], dtype=np.uint8).reshape(-1, 34)
                q = stored.load(name).numpy()
                d = stored.load(name + "_scale").numpy()
                self.assertEqual(q.reshape(-1, 32).view(np.uint8).tobytes(), raw[:, 2:].tobytes(), name)
                self.assertEqual(d.reshape(-1).view(np.uint8).tobytes(), raw[:, :2].tobytes(), name)
                copied += 1
        stored.close()
        self.assertGreater(copied, 20)

    @unittest.skipUnless(os.path.isdir(GGUF), "no ../shared/conformance/gguf next to the checkout")
    def test_dtype_auto_keeps_quantized_gguf_unets_8bit(self):
        for unet, want in (("tiny-unet-q4_0.gguf", "q8_0"), ("tiny-unet-f16.gguf", "float32")):
            out = self.export(TINY, "auto-" + unet, "--unet-gguf", os.path.join(GGUF, unet), "--dtype", "auto")
            with open(os.path.join(out, "model.json")) as f:
                self.assertEqual(json.load(f)["dtype"], want, unet)
            dtypes = {v["dtype"] for v in header(os.path.join(out, "unet.weights")).values()}
            self.assertEqual("I8" in dtypes, want == "q8_0", unet)

    @unittest.skipUnless(os.path.isdir(GGUF), "no ../shared/conformance/gguf next to the checkout")
    def test_gguf_q8_0_export_equals_dequantized_export_run_with_weights_q8(self):
        tensors = read_tensors(TINY)
        tensors.update(read_tensors(os.path.join(GGUF, "tiny-q8_0.dequant.safetensors")))
        os.makedirs(os.path.join(self.tmp.name, "dequant"), exist_ok=True)
        dequant = os.path.join(self.tmp.name, "dequant", "tiny-q8_0.safetensors")
        write_safetensors(dequant, sorted(tensors.items()))
        gguf = self.export(os.path.join(GGUF, "tiny-q8_0.gguf"), "gguf-q8", "--dtype", "q8_0")
        float32 = self.export(dequant, "dequant-f32")
        got = self.images(gguf)
        self.assertEqual([without_source_hash(p) for p in got],
                         [without_source_hash(p) for p in self.images(float32, "--weights", "q8")])
        self.assertNotEqual([pixel_data(p) for p in got], [pixel_data(p) for p in self.images(float32)])


if __name__ == "__main__":
    unittest.main()
