"""export_model.py --lora: LoRAs baked into the export's weights (sd_export/lora.py) against
diffusers' merged weights (tests/fixtures/lora, merged.safetensors, 1e-5), and bad LoRA files
refused with one line."""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from sd_export.safetensors_io import SafetensorsFile, encode_header, read_tensors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPORT = os.path.join(REPO, "scripts", "export_model.py")
FIX = os.path.join(REPO, "tests", "fixtures")
TINY = ["--config", os.path.join(FIX, "tiny", "v1-tiny.yaml"),
        "--text-config", os.path.join(FIX, "tiny", "text_encoder.json")]


def export(out, *loras):
    args = [sys.executable, EXPORT, os.path.join(FIX, "tiny", "tiny.safetensors"), "--out", out, *TINY]
    for lora in loras:
        args += ["--lora", lora]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


class ExportLoraTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def merged_error(self, case, loras):
        out = tempfile.mkdtemp(dir=self.tmp.name)
        r = export(out, *loras)
        self.assertEqual(r.returncode, 0, r.stderr)
        stages = {"model.diffusion_model.": read_tensors(os.path.join(out, "unet.weights")),
                  "cond_stage_model.transformer.": read_tensors(os.path.join(out, "text_encoder.weights"))}
        ref = read_tensors(os.path.join(FIX, "lora", "cases", case, "merged.safetensors"))
        worst = 0.0
        for name, want in ref.items():
            prefix = next(p for p in stages if name.startswith(p))
            got = stages[prefix][name[len(prefix):]]
            worst = max(worst, float(np.max(np.abs(got.numpy().astype(np.float64) - want.numpy()))))
        return worst

    def test_baked_weights_match_diffusers(self):
        lora = lambda f, m: os.path.join(FIX, "lora", f) + f":{m}"  # noqa: E731
        stacked = [lora("lora_a.safetensors", 0.6), lora("lora_b.safetensors", 1.0)]
        self.assertLessEqual(self.merged_error("la0.6_lb1.0_stacked_ddim10_64x64", stacked), 1e-5)
        self.assertLessEqual(self.merged_error("lb_diffusers_m0.8_ddim10_64x64",
                                               [lora("lora_b_diffusers.safetensors", 0.8)]), 1e-5)
        # The must-FAIL variation: multiplier 0.1 lower.
        self.assertGreater(self.merged_error("lb_diffusers_m0.8_ddim10_64x64",
                                             [lora("lora_b_diffusers.safetensors", 0.7)]), 1e-3)

    def bad(self, lora, words):
        r = export(tempfile.mkdtemp(dir=self.tmp.name), lora)
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        for w in words:
            self.assertIn(w, lines[0])

    def rewritten(self, name, mutate):
        with SafetensorsFile(os.path.join(FIX, "lora", "lora_b.safetensors")) as f:
            header, data = f.header, f.data()
        mutate(header)
        path = os.path.join(self.tmp.name, name)
        with open(path, "wb") as f:
            f.write(encode_header(header) + data)
        return path

    def test_bad_loras_are_one_line(self):
        def rename(h):
            k = "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"
            h[k.replace("q_proj", "x_proj")] = h.pop(k)
        self.bad(self.rewritten("renamed.safetensors", rename), ["renamed.safetensors", "match no layer", "x_proj"])

        def linear_proj_in(h):  # SD 2.x's linear proj_in: a 2-d down on SD 1.x's 1x1 conv
            k = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
            h["lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"] = h.pop(k + ".lora_down.weight")
            h["lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight"] = h.pop(k + ".lora_up.weight")
        self.bad(self.rewritten("sd2.safetensors", linear_proj_in), ["sd2.safetensors", "does not fit this model"])
        self.bad(os.path.join(self.tmp.name, "none.safetensors"), ["none.safetensors", "does not exist"])
        # An SDXL LoRA on this SD 1.x model (its SDXL export: tests/CMakeLists.txt export_sdxl_lora).
        self.bad(os.path.join(FIX, "sdxl-lora", "xl_lora_b.safetensors"),
                 ["xl_lora_b.safetensors", "is a LoRA for SDXL", "this model is SD 1.x or 2.x"])
        with open(os.path.join(FIX, "lora", "lora_a.safetensors"), "rb") as f:
            cut = f.read()[:5000]
        path = os.path.join(self.tmp.name, "cut.safetensors")
        with open(path, "wb") as f:
            f.write(cut)
        self.bad(path, ["cut.safetensors"])

    def test_weights_and_values_that_are_not_finite_numbers(self):
        """Issue 32: --lora f:1e300 and a NaN LoRA used to export Inf/NaN weights with exit 0."""
        good = os.path.join(FIX, "lora", "lora_a.safetensors")
        self.bad(good + ":1e300", ["--lora", "1e300", "outside"])
        self.bad(good + ":nan", ["--lora", "not a number"])
        with open(good, "rb") as f:
            raw = f.read()
        n = int.from_bytes(raw[:8], "little")
        path = os.path.join(self.tmp.name, "nan.safetensors")
        with open(path, "wb") as f:
            f.write(raw[:8 + n] + b"\xff" * (len(raw) - 8 - n))
        self.bad(path, ["nan.safetensors", "NaN or infinite"])


if __name__ == "__main__":
    unittest.main()
