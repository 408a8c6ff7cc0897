"""No code runs from a checkpoint (README "Security"): the export refuses zip checkpoints
that are not plain tensor pickles (a TorchScript archive would run its code inside
torch.load(weights_only=True)), and the CLI's list of the operations this tool's export
emits (src/io/op_allowlist.inc) is what scripts/gen_op_allowlist.py writes today.

Every payload writes a marker file in a temporary folder when loaded; each test shows
that the payload does write it when loaded without the check, so the test can fail.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

import torch

import diffusers_writer
import payloads
from sd_export.checkpoints import open_weight_file
from sd_export.configs import load_ldm_config, load_text_config
from sd_export.safetensors_io import read_tensors, write_safetensors
from test_export import fixtures_dir, run_export

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GEN = os.path.join(REPO, "scripts", "gen_op_allowlist.py")


def load_in_subprocess(call, path):
    """Loads path in a fresh python, without any check of ours: call is 'torch.load' or 'torch.jit.load'."""
    code = "import sys, warnings, torch; warnings.simplefilter('ignore'); "
    code += ("torch.load(sys.argv[1], weights_only=True)" if call == "torch.load" else "torch.jit.load(sys.argv[1])")
    return subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)


class RefusedCheckpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fx = fixtures_dir()
        cls.sizes = ["--config", os.path.join(cls.fx, "v1-tiny.yaml"),
                     "--text-config", os.path.join(cls.fx, "text_encoder.json")]

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sd-trust-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.marker = os.path.join(self.tmp, "marker")

    def assert_refused(self, checkpoint, must_mention):
        out = os.path.join(self.tmp, "out")
        r = run_export(checkpoint, "--out", out, *self.sizes)
        self.assertFalse(os.path.exists(self.marker), "the payload ran during the export")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("export_model.py: error: "), lines[0])
        self.assertNotIn("Traceback", r.stderr + r.stdout)
        self.assertIn(checkpoint, lines[0])
        self.assertIn(must_mention, lines[0])
        self.assertFalse(os.path.exists(out) and os.listdir(out))
        return lines[0]

    def assert_payload_works(self, path, call):
        self.assertFalse(os.path.exists(self.marker))
        load_in_subprocess(call, path)
        self.assertTrue(os.path.exists(self.marker), f"{call} of the payload did not write the marker: "
                                                     "the test would prove nothing")

    def test_torchscript_ckpt(self):
        evil = os.path.join(self.tmp, "evil.ckpt")
        payloads.write(self.marker, evil)
        line = self.assert_refused(evil, "TorchScript")
        print(f"\n  {line}", file=sys.stderr)
        self.assert_payload_works(evil, "torch.load")

    def test_torchscript_bin_in_a_diffusers_folder(self):
        sd = read_tensors(os.path.join(self.fx, "tiny.safetensors"))
        ldm = load_ldm_config(os.path.join(self.fx, "v1-tiny.yaml"))
        text = load_text_config(os.path.join(self.fx, "text_encoder.json"))
        folder = os.path.join(self.tmp, "diffusers")
        diffusers_writer.write_diffusers(sd, ldm, text, folder, "bin")
        bin_file = os.path.join(folder, "unet", "diffusion_pytorch_model.bin")
        self.assertTrue(os.path.isfile(bin_file))
        payloads.write(self.marker, bin_file)
        out = os.path.join(self.tmp, "out")
        r = run_export(folder, "--out", out)
        self.assertFalse(os.path.exists(self.marker), "the payload ran during the export")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(bin_file, lines[0])
        self.assertIn("TorchScript", lines[0])
        self.assertNotIn("Traceback", r.stderr)
        self.assert_payload_works(bin_file, "torch.load")

    def test_zip_with_more_than_a_tensor_pickle(self):
        good = os.path.join(self.tmp, "good.ckpt")
        torch.save({"state_dict": {"a": torch.zeros(2)}}, good)
        with zipfile.ZipFile(good) as z:
            entries = [(i.filename, z.read(i)) for i in z.infolist()]
        folder = entries[0][0].split("/")[0]
        for extra in ("constants.pkl", "code/__torch__.py", "extra/notes.txt", "other.pkl", ".data/version"):
            with self.subTest(extra):
                path = os.path.join(self.tmp, extra.replace("/", "_") + ".ckpt")
                with zipfile.ZipFile(path, "w") as z:
                    for name, data in entries:
                        z.writestr(name, data)
                    z.writestr(f"{folder}/{extra}", b"")
                self.assert_refused(path, extra)

    def test_plain_and_legacy_pickles_still_load(self):
        for zip_format in (True, False):
            with self.subTest(zip_format=zip_format):
                path = os.path.join(self.tmp, f"plain-{zip_format}.ckpt")
                torch.save({"state_dict": {"w": torch.ones(3)}}, path, _use_new_zipfile_serialization=zip_format)
                ckpt = open_weight_file(path)
                self.assertEqual(list(ckpt.keys()), ["w"])
                self.assertEqual(ckpt.shape("w"), (3,))


class NonFiniteWeights(unittest.TestCase):
    """A NaN or infinite weight makes NaN or black pictures with no other sign: the export refuses
    it in one line naming the file that holds it and the tensor, whatever the file's format."""

    @classmethod
    def setUpClass(cls):
        cls.fx = fixtures_dir()
        cls.sizes = ["--config", os.path.join(cls.fx, "v1-tiny.yaml"),
                     "--text-config", os.path.join(cls.fx, "text_encoder.json")]
        cls.sd = read_tensors(os.path.join(cls.fx, "tiny.safetensors"))

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sd-nan-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def spoiled(self, key, value):
        """The tiny checkpoint's tensors with one value of `key` replaced."""
        sd = dict(self.sd)
        sd[key] = sd[key].clone()
        sd[key].view(-1)[sd[key].numel() // 2] = value
        return sd

    def assert_refused(self, args, holder, key, sizes=True):
        out = os.path.join(self.tmp, "out")
        r = run_export(*args, "--out", out, *(self.sizes if sizes else []))
        lines = r.stderr.strip().splitlines()
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(f"{holder}: its tensor {key!r} holds NaN or infinite values", lines[0])
        self.assertNotIn("Traceback", r.stderr + r.stdout)
        self.assertFalse(os.path.exists(out))
        return lines[0]

    def test_values_beyond_float16_are_refused_by_a_float16_export(self):
        key = "model.diffusion_model.out.2.weight"
        path = os.path.join(self.tmp, "big.safetensors")
        write_safetensors(path, list(self.spoiled(key, 1e5).items()))
        out = os.path.join(self.tmp, "out")
        r = run_export(path, "--out", out, "--dtype", "float16", *self.sizes)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(f"{path}: its tensor {key!r} holds values beyond float16's range", lines[0])
        self.assertFalse(os.path.exists(out))
        r = run_export(path, "--out", out, "--dtype", "bfloat16", *self.sizes)  # bf16 has fp32's range
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_each_checkpoint_format(self):
        unet, vae, text = ("model.diffusion_model.out.2.weight", "first_stage_model.decoder.conv_out.weight",
                           "cond_stage_model.transformer.text_model.final_layer_norm.weight")
        for name, key, value in (("nan.safetensors", unet, float("nan")), ("inf.ckpt", vae, float("inf")),
                                 ("legacy.ckpt", text, float("-inf"))):
            with self.subTest(name):
                path = os.path.join(self.tmp, name)
                sd = self.spoiled(key, value)
                if name.endswith(".safetensors"):
                    write_safetensors(path, list(sd.items()))
                else:
                    torch.save({"state_dict": sd}, path, _use_new_zipfile_serialization=name == "inf.ckpt")
                line = self.assert_refused([path], path, key)
        print(f"\n  {line}", file=sys.stderr)

    def test_fp16_infinity(self):
        key = "model.diffusion_model.out.2.weight"
        path = os.path.join(self.tmp, "half.safetensors")
        write_safetensors(path, [(k, v.half()) for k, v in self.spoiled(key, float("inf")).items()])
        self.assert_refused([path], path, key)

    def test_vae_file_and_diffusers_folder_are_named(self):
        vae = os.path.join(self.tmp, "vae.safetensors")
        key = "first_stage_model.decoder.conv_in.weight"
        write_safetensors(vae, [(k, v) for k, v in self.spoiled(key, float("nan")).items()
                                if k.startswith(("first_stage_model.decoder.", "first_stage_model.post_quant_conv."))])
        self.assert_refused([os.path.join(self.fx, "tiny.safetensors"), "--vae", vae], vae, key)
        ldm = load_ldm_config(os.path.join(self.fx, "v1-tiny.yaml"))
        text = load_text_config(os.path.join(self.fx, "text_encoder.json"))
        folder = os.path.join(self.tmp, "diffusers")
        diffusers_writer.write_diffusers(self.spoiled("model.diffusion_model.out.2.weight", float("nan")), ldm, text,
                                         folder)
        self.assert_refused([folder], os.path.join(folder, "unet", "diffusion_pytorch_model.safetensors"),
                            "conv_out.weight", sizes=False)

    def test_the_unspoiled_checkpoint_exports(self):
        # The same writer without the bad value: the refusal above is the value's.
        path = os.path.join(self.tmp, "good.safetensors")
        write_safetensors(path, list(self.sd.items()))
        r = run_export(path, "--out", os.path.join(self.tmp, "out"), *self.sizes)
        self.assertEqual(r.returncode, 0, r.stderr)


class OperationList(unittest.TestCase):
    def test_committed_list_is_what_the_export_emits(self):
        r = subprocess.run([sys.executable, GEN, "--check"], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, "src/io/op_allowlist.inc differs from what scripts/gen_op_allowlist.py "
                         "writes now (run it and commit the file):\n" + r.stderr)

    def test_model_folder_payload_is_outside_the_list(self):
        import gen_op_allowlist  # scripts/ (on PYTHONPATH)
        with tempfile.TemporaryDirectory() as tmp:
            pt = os.path.join(tmp, "unet.pt")
            payloads.write(os.path.join(tmp, "marker"), pt)
            names, _ = gen_op_allowlist.names_in_archive(pt)
        with open(os.path.join(REPO, "src", "io", "op_allowlist.inc"), encoding="utf-8") as f:
            listed = {line.strip()[1:-2] for line in f if line.startswith('"')}
        self.assertIn("torch.from_file", names)
        self.assertNotIn("torch.from_file", listed)
        self.assertFalse(listed & gen_op_allowlist.NEVER)


if __name__ == "__main__":
    unittest.main()
