"""models/demo/train_demo.py in miniature: a few steps of every phase write a checkpoint that the
export takes like any user's, and the same seed gives the same bytes (the tensors; the
training is deterministic for a given thread count, which is what makes the committed demo model
reproducible from its command and seed)."""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import unittest

from sd_export.safetensors_io import SafetensorsFile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "models", "demo", "train_demo.py")
EXPORT = os.path.join(REPO, "scripts", "export_model.py")
TINY_RUN = ["--images", "48", "--vae-steps", "4", "--vae-full-steps", "2", "--vae-batch", "4",
            "--steps", "4", "--batch", "4", "--warmup", "2", "--evals", "1"]


def train(out, seed):
    r = subprocess.run([sys.executable, TRAIN, "--seed", str(seed), "--out", out] + TINY_RUN,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"train_demo.py failed ({r.returncode}): {r.stderr[-2000:]}")


def digest(path):
    """The tensors of a .safetensors file (its metadata holds the run's wall time)."""
    h = hashlib.sha256()
    with SafetensorsFile(path) as f:
        for name in sorted(f.keys()):
            h.update(json.dumps([name, f.dtype_name(name), f.shape(name)]).encode())
            h.update(f.load(name).numpy().tobytes())
    return h.hexdigest()


class TrainDemoInMiniature(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="sd-train-demo-")
        cls.runs = {}
        for name, seed in (("a", 3), ("b", 3), ("c", 4)):
            cls.runs[name] = os.path.join(cls.tmp.name, name)
            train(cls.runs[name], seed)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_writes_a_checkpoint_in_the_compvis_layout(self):
        out = self.runs["a"]
        for name in ("demo.safetensors", "v1-demo.yaml", "text_encoder.json", "train_log.json"):
            self.assertTrue(os.path.isfile(os.path.join(out, name)), name)
        with SafetensorsFile(os.path.join(out, "demo.safetensors")) as f:
            keys = set(f.keys())
        prefixes = {k.split(".")[0] for k in keys}
        self.assertEqual(prefixes, {"model", "first_stage_model", "cond_stage_model"})
        self.assertIn("model.diffusion_model.out.2.weight", keys)
        self.assertIn("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight", keys)
        with open(os.path.join(out, "train_log.json"), encoding="utf-8") as f:
            log = json.load(f)
        self.assertEqual(log["seed"], 3)
        self.assertEqual(len(log["history"]), 1)

    def test_export_takes_it_like_a_users_checkpoint(self):
        out = self.runs["a"]
        exported = os.path.join(self.tmp.name, "exported")
        r = subprocess.run([sys.executable, EXPORT, os.path.join(out, "demo.safetensors"),
                            "--config", os.path.join(out, "v1-demo.yaml"),
                            "--text-config", os.path.join(out, "text_encoder.json"), "--out", exported],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(exported, "model.json"), encoding="utf-8") as f:
            info = json.load(f)
        self.assertEqual(info["image_size"], 64)  # the demo world's pictures
        self.assertEqual(info["context_dim"], 32)

    def test_same_seed_same_weights_other_seed_other_weights(self):
        a, b, c = (digest(os.path.join(self.runs[k], "demo.safetensors")) for k in "abc")
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)


if __name__ == "__main__":
    unittest.main()
