"""Tests of scripts/export_model.py and the sd_export package (python/sd_export) against the
tiny conformance fixtures.

Run from the repository root with Debian's python (the one with torch):
    PYTHONPATH=python /usr/bin/python3 -m unittest discover -s tests/python -v
Fixtures: $SD_FIXTURES, else tests/fixtures/tiny, else ../shared/conformance/tiny beside the checkout.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

from sd_export.safetensors_io import SafetensorsFile, encode_header, read_tensors
from sd_export.stages import load_stage, weights_path  # exported stages with their weights

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPORT = os.path.join(REPO, "scripts", "export_model.py")
SHARED_TINY = os.path.join(REPO, "..", "shared", "conformance", "tiny")
SHARED_TINY2 = os.path.join(REPO, "..", "shared", "conformance", "tiny2")


def fixtures_dir():
    for d in (os.environ.get("SD_FIXTURES"), os.path.join(REPO, "tests", "fixtures", "tiny"), SHARED_TINY):
        if d and os.path.isfile(os.path.join(d, "tiny.safetensors")):
            return d
    raise unittest.SkipTest("no tiny fixtures found (set SD_FIXTURES)")


def run_export(*args):
    return subprocess.run([sys.executable, EXPORT, *args], capture_output=True, text=True, timeout=300)


def set_attention(module, mode, chunk=256):
    n = 0
    for _, sub in module.named_modules():
        if hasattr(sub, "attention_mode"):
            sub.attention_mode = mode
            sub.attention_chunk = chunk
            n += 1
    return n


def max_abs(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def rewrite_safetensors(src, dst, mutate):
    """Copy a safetensors file with its JSON header changed by mutate(header)."""
    with SafetensorsFile(src) as f:
        header, data = f.header, f.data()
    mutate(header)
    with open(dst, "wb") as f:
        f.write(encode_header(header) + data)


class ExportTinyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.fx = fixtures_dir()
        cls.cases_dir = os.path.join(cls.fx, "cases")
        cls.cases = sorted(d for d in os.listdir(cls.cases_dir) if os.path.isdir(os.path.join(cls.cases_dir, d)))
        cls.tmp = tempfile.TemporaryDirectory(prefix="sd-export-test-")
        cls.sizes = ["--config", os.path.join(cls.fx, "v1-tiny.yaml"),
                     "--text-config", os.path.join(cls.fx, "text_encoder.json")]
        cls.st_file = os.path.join(cls.fx, "tiny.safetensors")

        cls.st_dir = cls.tmpdir("st")
        r = run_export(cls.st_file, "--out", cls.st_dir, *cls.sizes)
        assert r.returncode == 0, r.stderr

        # The repository carries no .ckpt: make one from the safetensors, as the fixture's was made.
        cls.state_dict = read_tensors(cls.st_file)
        cls.ckpt_file = os.path.join(cls.tmp.name, "tiny.ckpt")
        torch.save({"state_dict": cls.state_dict}, cls.ckpt_file)
        cls.ckpt_dir = cls.tmpdir("ckpt")
        r = run_export(cls.ckpt_file, "--out", cls.ckpt_dir, *cls.sizes)
        assert r.returncode == 0, r.stderr

        cls.text = load_stage(os.path.join(cls.st_dir, "text_encoder.pt"))
        cls.unet = load_stage(os.path.join(cls.st_dir, "unet.pt"))
        cls.vae = load_stage(os.path.join(cls.st_dir, "vae_decoder.pt"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def tmpdir(cls, name):
        return os.path.join(cls.tmp.name, name)

    def case(self, case, name):
        return np.load(os.path.join(self.cases_dir, case, name))

    # ----------------------------------------------------------------- numerics

    def test_text_encoder(self):
        worst = 0.0
        with torch.no_grad():
            for case in self.cases:
                for ids, ref in (("tokens.npy", "cond.npy"), ("uncond_tokens.npy", "uncond.npy")):
                    out = self.text(torch.from_numpy(self.case(case, ids)))
                    self.assertEqual(tuple(out.shape), self.case(case, ref).shape)
                    worst = max(worst, max_abs(out, self.case(case, ref)))
        print(f"\n  text encoder max abs diff {worst:.3g}", file=sys.stderr)
        self.assertLessEqual(worst, 1e-4)

    def test_unet_all_attention_modes(self):
        self.assertGreater(set_attention(self.unet, 1), 0)
        worst = {}
        try:
            with torch.no_grad():
                for case in self.cases:
                    xs, ts, outs = self.case(case, "unet_x.npy"), self.case(case, "unet_t.npy"), \
                        self.case(case, "unet_out.npy")
                    context = torch.from_numpy(self.case(case, "unet_context.npy"))
                    for k in sorted({0, len(xs) // 2, len(xs) - 1}):
                        x, t = torch.from_numpy(xs[k]), torch.from_numpy(ts[k])
                        results = {}
                        for mode, chunk in ((0, 256), (1, 256), (2, 16), (2, 24), (3, 256)):
                            set_attention(self.unet, mode, chunk)
                            results[(mode, chunk)] = out = self.unet(x, t, context)
                            diff = max_abs(out, outs[k])
                            worst[(mode, chunk)] = max(worst.get((mode, chunk), 0.0), diff)
                            self.assertLessEqual(diff, 2e-4, f"{case} k={k} mode={mode} chunk={chunk}")
                        # one head at a time is the same arithmetic as all heads at once
                        self.assertTrue(torch.equal(results[(0, 256)], results[(1, 256)]), f"{case} k={k}")
        finally:
            set_attention(self.unet, 1, 256)
        print("\n  unet max abs diff per (mode, chunk): " +
              ", ".join(f"{k}: {v:.3g}" for k, v in worst.items()), file=sys.stderr)

    def test_vae_decoder_attention_modes(self):
        self.assertEqual(set_attention(self.vae, 1), 1)  # SD 1.x: only the mid-block attention
        worst = {}
        try:
            with torch.no_grad():
                for case in self.cases:
                    z = torch.from_numpy(self.case(case, "latents.npy")) / 0.18215
                    ref = self.case(case, "decoded.npy")
                    for mode, chunk in ((0, 256), (1, 256), (2, 16), (2, 24), (3, 256)):
                        set_attention(self.vae, mode, chunk)
                        diff = max_abs(self.vae(z), ref)
                        worst[(mode, chunk)] = max(worst.get((mode, chunk), 0.0), diff)
                        self.assertLessEqual(diff, 1e-3, f"{case} mode={mode} chunk={chunk}")
        finally:
            set_attention(self.vae, 1, 256)
        print("\n  vae max abs diff per (mode, chunk): " +
              ", ".join(f"{k}: {v:.3g}" for k, v in worst.items()), file=sys.stderr)

    def test_timestep_as_float_and_scalar(self):
        case = self.cases[0]
        x = torch.from_numpy(self.case(case, "unet_x.npy")[0])
        t = torch.from_numpy(self.case(case, "unet_t.npy")[0])
        context = torch.from_numpy(self.case(case, "unet_context.npy"))
        with torch.no_grad():
            ref = self.unet(x, t, context)
            self.assertTrue(torch.equal(self.unet(x, t.float(), context), ref))
            self.assertTrue(torch.equal(self.unet(x, t[0], context), ref))  # same t for the whole batch

    # ----------------------------------------------------------------- files

    def test_model_json(self):
        with open(os.path.join(self.st_dir, "model.json")) as f:
            info = json.load(f)
        expect = {"format": 1, "family": "sd1", "parameterization": "eps", "dtype": "float32",
                  "scale_factor": 0.18215, "latent_channels": 4, "downsample_factor": 8, "size_multiple": 16,
                  "image_size": 64,  # v1-tiny.yaml's image_size 8 (latent) x 8
                  "context_length": 77, "context_dim": 32, "bos_id": 49406, "eos_id": 49407, "pad_id": 49407,
                  "num_timesteps": 1000, "linear_start": 0.00085, "linear_end": 0.012,
                  "source": "tiny.safetensors"}
        for key, value in expect.items():
            self.assertEqual(info[key], value, key)
        # The file's SHA-256 (the PNG's "Model hash" is its first 10 digits), hashed here independently.
        import hashlib
        with open(self.st_file, "rb") as f:
            self.assertEqual(info["source_sha256"], hashlib.sha256(f.read()).hexdigest())
        # The checkpoint's own buffer was computed by ldm's register_schedule: must match exactly.
        ac = np.array(info["alphas_cumprod"], dtype=np.float64).astype(np.float32)
        self.assertEqual(ac.shape, (1000,))
        self.assertTrue(np.array_equal(ac, self.state_dict["alphas_cumprod"].numpy()))
        for name in info["files"].values():
            self.assertTrue(os.path.isfile(os.path.join(self.st_dir, name)), name)
        self.assertEqual([n for n in os.listdir(self.st_dir) if ".tmp" in n], [])
        for name in ("vocab.json", "merges.txt"):
            with open(os.path.join(self.st_dir, name), "rb") as a, \
                    open(os.path.join(REPO, "models", "clip", name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)

    def test_attention_attributes_default(self):
        unet = load_stage(os.path.join(self.st_dir, "unet.pt"))
        modes = [(s.attention_mode, s.attention_chunk) for _, s in unet.named_modules()
                 if hasattr(s, "attention_mode")]
        # tiny: transformers in 2 input, 1 middle and 3 output blocks, each with attn1 and attn2
        self.assertEqual(len(modes), 2 * 6)
        self.assertTrue(all(m == (1, 256) for m in modes))

    def test_convolutions_know_where_they_run(self):
        # latent_div: the UNet's layers at the latent's size / 1, / 2, ...; an Upsample's conv runs on
        # the level above's size. The C++ program leaves bf16 weights plain where sd::conv3x3 takes them.
        unet = load_stage(os.path.join(self.st_dir, "unet.pt"))
        divs = {name: s.latent_div for name, s in unet.named_modules() if hasattr(s, "latent_div")}
        second = ("input_blocks.4.", "input_blocks.5.", "middle_block.", "output_blocks.0.", "output_blocks.1.",
                  "output_blocks.2.0.")  # tiny: channel_mult [1, 2]
        self.assertGreater(len(divs), 30)
        for name, div in divs.items():
            with self.subTest(name):
                self.assertEqual(div, 2 if name.startswith(second) else 1)
        self.assertEqual(divs["output_blocks.2.1.conv"], 1)  # the upsampler's
        unit = {name for name, s in unet.named_modules() if getattr(s, "unit_3x3", False)}
        self.assertIn("input_blocks.1.0.in_layers.2", unit)
        self.assertNotIn("input_blocks.3.0.op", unit)  # stride 2
        self.assertNotIn("input_blocks.4.0.skip_connection", unit)  # 1x1
        pointwise = {name for name, s in unet.named_modules() if getattr(s, "unit_1x1", False)}
        self.assertIn("input_blocks.4.0.skip_connection", pointwise)  # sd::conv1x1 in bf16
        self.assertNotIn("input_blocks.1.0.in_layers.2", pointwise)
        self.assertNotIn("input_blocks.3.0.op", pointwise)

    def test_vae_convolutions_know_where_they_run(self):
        # latent_mul: the VAE's layers at the latent's size x 1, 2, 4, 8 (tiny: 4 levels, like SD's);
        # an upsampler's conv runs on its level's size x 2. The UNet's layers have none.
        dec = load_stage(os.path.join(self.st_dir, "vae_decoder.pt"))
        muls = {name: s.latent_mul for name, s in dec.named_modules() if hasattr(s, "latent_mul")}
        self.assertGreater(len(muls), 20)
        for name, mul in muls.items():
            with self.subTest(name):
                want = {"decoder.conv_in": 1, "decoder.conv_out": 8}.get(name)
                if name.startswith("decoder.mid."):
                    want = 1
                elif name.startswith("decoder.up."):
                    level = int(name.split(".")[2])  # up.0 is the finest
                    want = 2 ** (3 - level) * (2 if ".upsample." in name else 1)
                if name == "post_quant_conv":
                    want = 0  # 1x1, before the decoder
                self.assertEqual(mul, want)
        enc = load_stage(os.path.join(self.st_dir, "vae_encoder.pt"))
        enc_muls = {name: s.latent_mul for name, s in enc.named_modules() if hasattr(s, "latent_mul")}
        self.assertEqual(enc_muls["encoder.conv_in"], 8)
        self.assertEqual(enc_muls["encoder.down.0.block.0.conv1"], 8)
        self.assertEqual(enc_muls["encoder.down.2.block.0.conv1"], 2)
        self.assertEqual(enc_muls["encoder.mid.block_2.conv2"], 1)
        self.assertEqual(enc_muls["encoder.conv_out"], 1)
        unet = load_stage(os.path.join(self.st_dir, "unet.pt"))
        self.assertEqual({s.latent_mul for _, s in unet.named_modules() if hasattr(s, "latent_mul")}, {0})

    def test_weights_live_beside_the_archive(self):
        # The C++ loader maps STAGE.weights instead of copying tensors out of STAGE.pt.
        for stage in ("text_encoder", "unet", "vae_decoder", "vae_encoder"):
            pt = os.path.join(self.st_dir, stage + ".pt")
            raw = torch.jit.load(pt)
            self.assertTrue(all(p.numel() == 0 for p in raw.parameters()), stage)
            with open(weights_path(pt), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
            self.assertEqual((8 + n) % 64, 0, "the data section starts 64-byte aligned")
            stored = read_tensors(weights_path(pt))
            loaded = dict(load_stage(pt).named_parameters())
            self.assertEqual(sorted(stored), sorted(loaded), stage)
            self.assertTrue(all(torch.equal(stored[k], loaded[k]) and loaded[k].numel() > 0 for k in loaded), stage)

    def assert_same_weights(self, dir_a, dir_b, convert=None):
        for name in ("text_encoder.pt", "unet.pt", "vae_decoder.pt", "vae_encoder.pt"):
            a = load_stage(os.path.join(dir_a, name)).state_dict()
            b = load_stage(os.path.join(dir_b, name)).state_dict()
            self.assertEqual(sorted(a), sorted(b), name)
            for k in a:
                tb = convert(b[k]) if convert else b[k]
                self.assertTrue(torch.equal(a[k], tb), f"{name}: {k}")

    def test_ckpt_export_has_identical_weights(self):
        self.assert_same_weights(self.st_dir, self.ckpt_dir)

    def test_shared_ckpt(self):
        shared = os.path.join(SHARED_TINY, "tiny.ckpt")
        if not os.path.isfile(shared):
            self.skipTest("no shared tiny.ckpt")
        out = self.tmpdir("shared_ckpt")
        r = run_export(shared, "--out", out, *self.sizes)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_weights(self.st_dir, out)

    def test_float16_storage(self):
        out = self.tmpdir("fp16")
        r = run_export(self.st_file, "--out", out, "--dtype", "float16", *self.sizes)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "model.json")) as f:
            self.assertEqual(json.load(f)["dtype"], "float16")
        unet = load_stage(os.path.join(out, "unet.pt"))
        self.assertTrue(all(p.dtype == torch.float16 for p in unet.parameters()))
        # The fixture's weights are fp16-representable, so nothing is lost.
        self.assert_same_weights(self.st_dir, out, convert=lambda t: t.float())

    def test_layers_widen_half_weights_and_split_work_without_changing_results(self):
        # The UNet/VAE layers of sd_modules: fp16 weights computed in fp32 give
        # the fp32 layer's result on the widened weights; conv_split and
        # ff_chunk run the same layer in pieces.
        from sd_export import modules as sd_modules
        torch.manual_seed(0)
        conv = sd_modules.Conv2d(8, 24, 3, padding=1).eval()
        x = torch.randn(2, 8, 6, 6)
        with torch.no_grad():
            ref = conv(x)
            conv.conv_split = 8 * 9 * 4 * 5  # five output channels a call
            split = conv(x)
            conv.conv_split = 0
            conv.half()
            widened = conv(x)
            again = torch.nn.functional.conv2d(x, conv.weight.float(), conv.bias.float(), padding=1)
        self.assertTrue(torch.equal(ref, split))
        self.assertEqual(widened.dtype, torch.float32)
        self.assertTrue(torch.equal(widened, again))
        self.assertLess((widened - ref).abs().max().item(), 1e-2)
        ff = sd_modules.FeedForward(16).eval()
        t = torch.randn(2, 37, 16)
        with torch.no_grad():
            whole = ff(t)
            ff.ff_chunk = 5
            pieces = ff(t)
        self.assertLess((whole - pieces).abs().max().item(), 1e-6)
        # Scripted, the attributes stay settable (C++ sets them after loading).
        scripted = torch.jit.script(sd_modules.FeedForward(16).eval())
        scripted.ff_chunk = 5
        self.assertEqual(scripted.ff_chunk, 5)
        # GEGLU's fused_rows (set from C++ with prepacking): sd::linear without bias, then
        # sd::geglu with it; the same result as the chunk + gelu + product, scripted too.
        geglu = torch.jit.script(sd_modules.GEGLU(16, 24).eval())
        with torch.no_grad():
            plain = geglu(t)
            geglu.fused_rows = 1
            fused = geglu(t)
        self.assertEqual(fused.shape, (2, 37, 24))
        self.assertLess((plain - fused).abs().max().item(), 1e-5)

    def test_random_init_is_deterministic(self):
        a, b = self.tmpdir("rand_a"), self.tmpdir("rand_b")
        for out in (a, b):
            r = run_export("--random-init", "--seed", "3", "--out", out, *self.sizes)
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_weights(a, b)
        with open(os.path.join(a, "model.json")) as f:
            self.assertIn("random", json.load(f)["source"])
        unet = load_stage(os.path.join(a, "unet.pt"))
        with torch.no_grad():
            out = unet(torch.randn(1, 4, 8, 8), torch.tensor([500]), torch.randn(1, 77, 32))
        self.assertTrue(torch.isfinite(out).all())

    # ----------------------------------------------------------------- failures

    def assert_fails_cleanly(self, args, names, out, expect=None):
        r = run_export(*args, "--out", out)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("export_model.py: error: "), lines[0])
        self.assertNotIn("Traceback", r.stderr + r.stdout)
        self.assertIn(names, lines[0])
        if expect:
            self.assertIn(expect, lines[0])
        # no half-written model
        left = os.listdir(out) if os.path.exists(out) else []
        self.assertEqual(left, [])
        return lines[0]

    def test_bad_inputs(self):
        tmp = tempfile.mkdtemp(dir=self.tmp.name)
        st = self.st_file
        with open(st, "rb") as f:
            st_bytes = f.read()
        with open(self.ckpt_file, "rb") as f:
            ckpt_bytes = f.read()
        (header_len,) = struct.unpack("<Q", st_bytes[:8])

        def write(name, data):
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(data)
            return path

        def rewrite(name, mutate):
            path = os.path.join(tmp, name)
            rewrite_safetensors(st, path, mutate)
            return path

        def drop_key(h):
            del h["model.diffusion_model.out.2.weight"]

        def reshape_key(h):
            h["model.diffusion_model.time_embed.0.weight"]["shape"] = [32, 128]

        def sd2_like(h):
            old = "cond_stage_model.transformer.text_model."
            for k in [k for k in h if k.startswith(old)]:
                h["cond_stage_model.model." + k[len(old):]] = h.pop(k)

        def offsets_out_of_range(h):
            h["model.diffusion_model.out.2.bias"]["data_offsets"][1] = 10 ** 12

        def size_mismatch(h):
            h["model.diffusion_model.out.2.bias"]["shape"] = [5]

        def not_sd(h):
            for k in [k for k in h if k.startswith("model.diffusion_model.")]:
                h["unet." + k] = h.pop(k)

        cases = [
            ("garbage", write("garbage.safetensors", os.urandom(4096)), None),
            ("empty", write("empty.safetensors", b""), None),
            ("truncated st", write("trunc.safetensors", st_bytes[: len(st_bytes) // 2]), "truncated"),
            ("header too long", write("hdr.safetensors", struct.pack("<Q", 1 << 40) + st_bytes[8:]), None),
            ("invalid json", write("json.safetensors", st_bytes[:8] + b"{" + b"x" * (header_len - 1)
                                   + st_bytes[8 + header_len:]), "JSON"),
            ("offsets", rewrite("offsets.safetensors", offsets_out_of_range), "out.2.bias"),
            ("size mismatch", rewrite("size.safetensors", size_mismatch), "out.2.bias"),
            ("missing key", rewrite("missing.safetensors", drop_key), "model.diffusion_model.out.2.weight"),
            ("wrong shape", rewrite("shape.safetensors", reshape_key), "model.diffusion_model.time_embed.0.weight"),
            ("no text encoder", rewrite("sd2.safetensors", sd2_like), "text encoder"),
            ("not sd", rewrite("notsd.safetensors", not_sd), "not a Stable Diffusion"),
            ("truncated ckpt", write("trunc.ckpt", ckpt_bytes[: len(ckpt_bytes) // 2]), None),
            ("garbage ckpt", write("garbage.ckpt", b"\x80" + os.urandom(1000)), None),
            ("missing file", os.path.join(tmp, "does-not-exist.safetensors"), "does not exist"),
        ]
        if os.path.isfile(os.path.join(SHARED_TINY2, "tiny2.safetensors")):
            cases.append(("shared tiny2", os.path.join(SHARED_TINY2, "tiny2.safetensors"), "SD 2"))
        for i, (what, path, expect) in enumerate(cases):
            with self.subTest(what):
                line = self.assert_fails_cleanly([path, *self.sizes], os.path.basename(path),
                                                 os.path.join(tmp, f"out{i}"), expect)
                print(f"\n  {what}: {line}", file=sys.stderr, end="")
        print(file=sys.stderr)
        with self.subTest("missing config"):
            missing_cfg = os.path.join(tmp, "nope.yaml")
            self.assert_fails_cleanly([st, "--config", missing_cfg], "nope.yaml", os.path.join(tmp, "outc"))
        with self.subTest("default sizes do not fit tiny"):
            self.assert_fails_cleanly([st], "tiny.safetensors", os.path.join(tmp, "outd"), "--config")

    def test_failure_keeps_previous_model(self):
        out = self.tmpdir("keep")
        shutil.copytree(self.st_dir, out)
        with open(os.path.join(out, "model.json"), "rb") as f:
            before = f.read()
        bad = os.path.join(self.tmp.name, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(b"\0" * 7)
        r = run_export(bad, "--out", out, *self.sizes)
        self.assertEqual(r.returncode, 1)
        with open(os.path.join(out, "model.json"), "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(sorted(os.listdir(out)), sorted(os.listdir(self.st_dir)))


if __name__ == "__main__":
    unittest.main()
