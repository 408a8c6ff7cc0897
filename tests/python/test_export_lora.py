"""export_model.py --lora: LoRAs baked into the export's weights (sd_export/lora.py) against
diffusers' merged weights (tests/fixtures/lora, merged.safetensors, 1e-5), and bad LoRA files
refused with one line."""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from sd_export.safetensors_io import SafetensorsFile, encode_header, read_tensors, write_safetensors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPORT = os.path.join(REPO, "scripts", "export_model.py")
FIX = os.path.join(REPO, "tests", "fixtures")
TINY = ["--config", os.path.join(FIX, "tiny", "v1-tiny.yaml"),
        "--text-config", os.path.join(FIX, "tiny", "text_encoder.json")]


def export(out, *loras, extra=()):
    args = [sys.executable, EXPORT, os.path.join(FIX, "tiny", "tiny.safetensors"), "--out", out, *TINY, *extra]
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

    def lycoris(self, kind, name=None):
        """lora_a rewritten as a LoHa (second factor all ones) or a LoKr (w1 = [[1]]): the same change."""
        import torch
        modules = {}
        with SafetensorsFile(os.path.join(FIX, "lora", "lora_a.safetensors")) as f:
            for k in f.keys():
                m, _, part = k.partition(".")
                modules.setdefault(m, {})[part] = f.load(k).float()
        out = {}
        for m, p in modules.items():
            up, down = p["lora_up.weight"].flatten(1), p["lora_down.weight"].flatten(1)
            out[m + ".alpha"] = p["alpha"]
            if kind == "loha":
                out.update({m + ".hada_w1_a": up, m + ".hada_w1_b": down, m + ".hada_w2_a": torch.ones(up.shape[0], 1),
                            m + ".hada_w2_b": torch.ones(1, down.shape[1])})
            else:
                out.update({m + ".lokr_w1": torch.ones(1, 1), m + ".lokr_w2_a": up, m + ".lokr_w2_b": down})
        path = os.path.join(self.tmp.name, name or f"lora_a_{kind}.safetensors")
        write_safetensors(path, sorted(out.items()))
        return path

    def test_baked_lycoris_match_diffusers(self):
        """LyCORIS LoHa and LoKr files bake as the run-time --lora merges them (tests/conformance/test_lora.cpp)."""
        for kind in ("loha", "lokr"):
            self.assertLessEqual(self.merged_error("la_m1.0_ddim10_64x64", [self.lycoris(kind) + ":1.0"]), 1e-5)
        import torch
        bad = os.path.join(self.tmp.name, "kron.safetensors")  # kron [32, 16] on a [32, 32] layer
        m = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
        write_safetensors(bad, [(m + ".lokr_w1", torch.ones(4, 4)), (m + ".lokr_w2", torch.ones(8, 4))])
        self.bad(bad, ["kron.safetensors", "does not fit this model", "lokr_w2 [8, 4]"])
        half = os.path.join(self.tmp.name, "half.safetensors")  # a LoHa without its second factor
        write_safetensors(half, [(m + ".hada_w1_a", torch.ones(32, 2)), (m + ".hada_w1_b", torch.ones(2, 32))])
        self.bad(half, ["half.safetensors", "match no layer"])

    def test_lycoris_products_follow_their_formulas(self):
        """Each kind's product (sd_export.lora.delta) against its formula written another way: the CP
        product as a sum over the core's entries, the Kronecker product block by block."""
        import torch
        from sd_export.lora import delta
        g = torch.Generator().manual_seed(7)
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731

        def cp(t, a, b):  # sum over i, j of t[i, j] (a kh x kw map) times the outer product a[i] x b[j]
            out = np.zeros((a.shape[1], b.shape[1]) + tuple(t.shape[2:]))
            for i in range(t.shape[0]):
                for j in range(t.shape[1]):
                    out += np.einsum("p,r,kl->prkl", a[i].numpy(), b[j].numpy(), t[i, j].numpy())
            return out

        def kron(w1, w2):
            c, d = w2.shape[:2]
            out = np.zeros((w1.shape[0] * c, w1.shape[1] * d) + tuple(w2.shape[2:]))
            for i in range(w1.shape[0]):
                for j in range(w1.shape[1]):
                    out[i * c:(i + 1) * c, j * d:(j + 1) * d] = float(w1[i, j]) * np.asarray(w2)
            return out

        p = {"hada_t1": r(3, 4, 3, 3), "hada_w1_a": r(3, 32), "hada_w1_b": r(4, 32), "hada_w2_a": r(32, 2),
             "hada_w2_b": r(2, 288)}
        want = cp(p["hada_t1"], p["hada_w1_a"], p["hada_w1_b"]) * (p["hada_w2_a"] @ p["hada_w2_b"]).numpy().reshape(
            32, 32, 3, 3)
        cases = [("loha", p, want)]
        p = {"lokr_w1_a": r(4, 2), "lokr_w1_b": r(2, 8), "lokr_w2": r(8, 4, 3, 3)}
        cases.append(("lokr", p, kron((p["lokr_w1_a"] @ p["lokr_w1_b"]).numpy(), p["lokr_w2"].numpy())))
        p = {"lokr_w1": r(8, 8), "lokr_t2": r(2, 3, 3, 3), "lokr_w2_a": r(2, 4), "lokr_w2_b": r(3, 4)}
        cases.append(("lokr", p, kron(p["lokr_w1"].numpy(), cp(p["lokr_t2"], p["lokr_w2_a"], p["lokr_w2_b"]))))
        p = {"down": r(5, 32, 1, 1), "mid": r(6, 5, 3, 3), "up": r(32, 6, 1, 1)}
        cases.append(("lora", p, cp(p["mid"], p["up"].flatten(1).t(), p["down"].flatten(1))))
        for kind, parts, expected in cases:
            got = delta(kind, parts, (32, 32, 3, 3)).numpy()
            self.assertLess(float(np.max(np.abs(got - expected))), 1e-9 * float(np.max(np.abs(expected))), kind)

    def test_baked_dora_rescales_the_diffusers_merge(self):
        """lora_a with a DoRA magnitude, for each weight merged.safetensors holds, of u times the norms of
        diffusers' merged weight along one axis (u random in [0.5, 1.5]) bakes that weight times u."""
        import torch
        from sd_export.lora import diffusers_unet_module, dora_shape
        g = torch.Generator().manual_seed(3)
        ref = read_tensors(os.path.join(FIX, "lora", "cases", "la_m1.0_ddim10_64x64", "merged.safetensors"))
        with SafetensorsFile(os.path.join(FIX, "lora", "lora_a.safetensors")) as f:
            plain = [(k, f.load(k).float()) for k in f.keys()]
        for axis in (0, 1):
            extra, want = [], {}
            for name, w in ref.items():
                if name.startswith("model.diffusion_model."):
                    key = "lora_unet_" + diffusers_unet_module(name[22:-7]).replace(".", "_")
                else:
                    key = "lora_te_" + name[len("cond_stage_model.transformer."):-7].replace(".", "_")
                others = [i for i in range(w.dim()) if i != axis]
                u = torch.rand(dora_shape(w.shape, axis), generator=g) + 0.5
                extra.append((key + ".dora_scale", torch.linalg.vector_norm(w, 2, dim=others, keepdim=True) * u))
                want[name] = w * u
            self.assertEqual(len(extra), 17)
            path = os.path.join(self.tmp.name, f"dora{axis}.safetensors")
            write_safetensors(path, sorted(plain + extra))
            out = tempfile.mkdtemp(dir=self.tmp.name)
            r = export(out, path + ":1.0")
            self.assertEqual(r.returncode, 0, r.stderr)
            stages = {"model.diffusion_model.": read_tensors(os.path.join(out, "unet.weights")),
                      "cond_stage_model.transformer.": read_tensors(os.path.join(out, "text_encoder.weights"))}
            for name, w in want.items():
                prefix = next(p for p in stages if name.startswith(p))
                got = stages[prefix][name[len(prefix):]].float()
                self.assertLessEqual(float((got - w).abs().max()), 2e-5, f"{axis} {name}")
                self.assertGreater(float((got - ref[name]).abs().max()), 1e-3, f"u changed nothing: {name}")
        bad = os.path.join(self.tmp.name, "dora_bad.safetensors")  # a magnitude per element, not per row
        m = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
        write_safetensors(bad, [(m + ".dora_scale", torch.ones(32, 32)), (m + ".lora_down.weight", torch.ones(2, 32)),
                                (m + ".lora_up.weight", torch.ones(32, 2))])
        self.bad(bad, ["dora_bad.safetensors", "DoRA magnitude dora_scale [32, 32]", "per output [32, 1]"])

    def test_dora_merge_follows_its_formula(self):
        """sd_export.lora.merge with a DoRA magnitude, at several multipliers and on both axes, against
        W + m * (rescaled(W + D) - W) computed row by row (or column by column) in numpy."""
        import torch
        from sd_export.lora import dora_shape, merge
        g = torch.Generator().manual_seed(9)
        for shape in ((32, 32, 3, 3), (32, 16)):
            down_shape, up_shape = ((4, 32, 3, 3), (32, 4, 1, 1)) if len(shape) == 4 else ((4, 16), (32, 4))
            p = {"down": torch.randn(*down_shape, generator=g), "up": torch.randn(*up_shape, generator=g) * 0.1}
            w = torch.randn(*shape, generator=g)
            for axis in (0, 1):
                p["dora_scale"] = torch.rand(dora_shape(shape, axis), generator=g) * 5 + 1
                for m in (1.0, 0.7, -0.5):
                    got = merge(w, "lora", p, 0.5, m).numpy()
                    W = w.numpy().astype(np.float64)
                    merged = W + 0.5 * (p["up"].flatten(1).double() @ p["down"].flatten(1).double()).numpy().reshape(
                        shape)
                    rescaled = merged.copy()
                    mag = p["dora_scale"].numpy().reshape(-1)
                    for i in range(shape[axis]):
                        sl = np.take(rescaled, i, axis=axis)
                        idx = [slice(None)] * len(shape)
                        idx[axis] = i
                        rescaled[tuple(idx)] = sl * (mag[i] / np.sqrt((sl ** 2).sum()))
                    want = W + m * (rescaled - W)
                    self.assertLess(float(np.max(np.abs(got - want))), 1e-5 * float(np.max(np.abs(want))),
                                    f"{shape} axis {axis} m {m}")

    def test_merged_weights_beyond_the_exported_type_are_refused(self):
        """A LoRA whose finite values are far too large: past fp32 after the merge, or past fp16 in a float16
        export, is refused naming the file; fp32 holds what fp16 cannot."""
        import torch
        m = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
        paths = {}
        for name, value in (("huge", 1e20), ("large", 200.0)):
            paths[name] = os.path.join(self.tmp.name, name + ".safetensors")
            write_safetensors(paths[name], [(m + ".lora_down.weight", torch.full((4, 32), value)),
                                            (m + ".lora_up.weight", torch.full((32, 4), value))])
        self.bad(paths["huge"], ["huge.safetensors", m, "beyond fp32's range"])
        self.bad(paths["large"], ["large.safetensors", "beyond fp16's range", "--dtype float32"],
                 extra=("--dtype", "float16"))
        r = export(tempfile.mkdtemp(dir=self.tmp.name), paths["large"])
        self.assertEqual(r.returncode, 0, r.stderr)

    def bad(self, lora, words, extra=()):
        r = export(tempfile.mkdtemp(dir=self.tmp.name), lora, extra=extra)
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
