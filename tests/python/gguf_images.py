"""An export from the fixture's q8_0 GGUF file runs, and its images equal byte for byte those
of an export of the same weights written as float32 safetensors (ggml's expanded tensors in
place of the quantized ones, the rest from the tiny checkpoint). Needs SD_TXT2IMG (the tool)
and ../shared/conformance/gguf."""

import io
import os
import tempfile
import unittest

import tool_runs
from sd_export.safetensors_io import read_tensors, write_safetensors
from tool_runs import GGUF, TINY, pixel_data, without_source_hash


@unittest.skipUnless(os.path.isdir(GGUF), "no ../shared/conformance/gguf next to the checkout")
class GgufImages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        tensors = read_tensors(TINY)
        tensors.update(read_tensors(os.path.join(GGUF, "tiny-q8_0.dequant.safetensors")))
        # The same file name: the pictures' text names the model by it.
        os.mkdir(os.path.join(cls.tmp.name, "float32"))
        cls.float32 = os.path.join(cls.tmp.name, "float32", "tiny-q8_0.safetensors")
        write_safetensors(cls.float32, sorted(tensors.items()))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def export(self, checkpoint, name):
        out = os.path.join(self.tmp.name, name)
        r = tool_runs.export(checkpoint, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def images(self, model, *extra):
        return tool_runs.two_pictures(self, model, self.tmp.name, *extra, seed=11, prompt="a red house by the sea")

    def test_q8_0_gguf_export_equals_float32_export(self):
        gguf = self.export(os.path.join(GGUF, "tiny-q8_0.gguf"), "from-gguf")
        float32 = self.export(self.float32, "from-float32")
        type(self).gguf_model = gguf
        original = self.export(TINY, "from-original")
        got = self.images(gguf)
        # Byte for byte but for the source file's hash in the text.
        self.assertEqual([without_source_hash(p) for p in got], [without_source_hash(p) for p in self.images(float32)])
        # The comparison can fail: the unquantized checkpoint's pixels differ.
        self.assertNotEqual([pixel_data(p) for p in got], [pixel_data(p) for p in self.images(original)])

    def test_q8_weights_close_to_fp32(self):
        # --weights q8: the UNet narrowed to 8-bit blocks at load; its pictures differ from fp32's
        # (the convolutions, f32 in the GGUF file, are narrowed too) but only slightly.
        import numpy as np
        from PIL import Image
        model = getattr(self, "gguf_model", None) or self.export(os.path.join(GGUF, "tiny-q8_0.gguf"), "from-gguf-2")
        fp32, q8 = self.images(model, "--weights", "fp32"), self.images(model, "--weights", "q8")
        for a, b in zip(fp32, q8):
            x = np.asarray(Image.open(io.BytesIO(a)), dtype=np.float64)
            y = np.asarray(Image.open(io.BytesIO(b)), dtype=np.float64)
            mse = float(np.mean((x - y) ** 2))
            self.assertGreater(mse, 0.0)
            self.assertGreater(10 * np.log10(255.0 ** 2 / mse), 35.0)


if __name__ == "__main__":
    unittest.main()
