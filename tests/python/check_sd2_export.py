"""SD 2.x export (OpenCLIP text tower, linear transformer projections, v-prediction) against
the tiny2 fixtures, and diffusers folders: a diffusers-layout copy of a single file (written
by diffusers_writer.py, the inverse key mapping) must export to the same weights.

Fixtures: tests/fixtures/tiny2 and tests/fixtures/tiny (or ../shared/conformance).
Named check_*.py so that the test_*.py discovery of python_export_tests does not run it a
second time: CTest runs it as its own test (python_sd2_export_tests), in parallel.
"""

import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import torch

import diffusers_writer
from sd_export import diffusers_layout
from sd_export.configs import load_ldm_config, load_text_config
from sd_export.safetensors_io import read_tensors
from test_export import load_stage, run_export  # exported stages; the export command, run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fixture_dir(name, probe):
    for d in (os.path.join(REPO, "tests", "fixtures", name), os.path.join(REPO, "..", "shared", "conformance", name)):
        if os.path.isfile(os.path.join(d, probe)):
            return d
    raise unittest.SkipTest(f"no {name} fixtures")


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def max_abs(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


class Exports(unittest.TestCase):
    """Base: a temporary folder and weight comparison."""

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.tmp = tempfile.TemporaryDirectory(prefix="sd-sd2-test-")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def export(cls, name, *args):
        out = os.path.join(cls.tmp.name, name)
        r = run_export(*args, "--out", out)
        assert r.returncode == 0, r.stderr
        return out

    def assert_same_weights(self, dir_a, dir_b,
                            stages=("text_encoder.pt", "unet.pt", "vae_decoder.pt", "vae_encoder.pt")):
        for name in stages:
            a = load_stage(os.path.join(dir_a, name)).state_dict()
            b = load_stage(os.path.join(dir_b, name)).state_dict()
            self.assertEqual(sorted(a), sorted(b), name)
            for k in a:
                self.assertTrue(torch.equal(a[k], b[k]), f"{name}: {k}")

    def assert_same_model_json(self, dir_a, dir_b):
        a, b = read_json(os.path.join(dir_a, "model.json")), read_json(os.path.join(dir_b, "model.json"))
        for info in (a, b):
            info.pop("source")
            info.pop("source_sha256", None)  # each checkpoint file's own
            info.pop("parameterization_source")
        self.assertEqual(a, b)
        for name in ("vocab.json", "merges.txt"):
            with open(os.path.join(dir_a, name), "rb") as fa, open(os.path.join(dir_b, name), "rb") as fb:
                self.assertEqual(fa.read(), fb.read(), name)


class ExportTiny2Test(Exports):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.fx = fixture_dir("tiny2", "tiny2.safetensors")
        cls.st_file = os.path.join(cls.fx, "tiny2.safetensors")
        cls.text = ["--text-config", os.path.join(cls.fx, "text_encoder.json")]
        cls.v_cfg = ["--config", os.path.join(cls.fx, "v2-tiny-v.yaml")] + cls.text
        cls.st_dir = cls.export("st", cls.st_file, *cls.v_cfg)
        cls.state_dict = read_tensors(cls.st_file)
        cls.ckpt_file = os.path.join(cls.tmp.name, "tiny2.ckpt")
        torch.save({"state_dict": cls.state_dict}, cls.ckpt_file)
        cls.ckpt_dir = cls.export("ckpt", cls.ckpt_file, *cls.v_cfg)
        cls.cases_dir = os.path.join(cls.fx, "cases")
        cls.cases = sorted(d for d in os.listdir(cls.cases_dir) if os.path.isdir(os.path.join(cls.cases_dir, d)))

    def case(self, case, name):
        return np.load(os.path.join(self.cases_dir, case, name))

    def test_model_json(self):
        info = read_json(os.path.join(self.st_dir, "model.json"))
        expect = {"family": "sd2", "parameterization": "v", "parameterization_source": "config v2-tiny-v.yaml",
                  "pad_id": 0, "bos_id": 49406, "eos_id": 49407, "tokenizer": "open_clip", "context_dim": 64,
                  "text_layers_used": 2, "size_multiple": 32, "image_size": 64, "source": "tiny2.safetensors"}
        for key, value in expect.items():
            self.assertEqual(info[key], value, key)
        ac = np.array(info["alphas_cumprod"], dtype=np.float64).astype(np.float32)
        self.assertTrue(np.array_equal(ac, self.state_dict["alphas_cumprod"].numpy()))
        # open_clip's names for the start and end tokens, so the C++ tokenizer treats those texts as special
        vocab = read_json(os.path.join(self.st_dir, "vocab.json"))
        self.assertEqual((vocab["<start_of_text>"], vocab["<end_of_text>"], vocab["!"]), (49406, 49407, 0))
        self.assertNotIn("<|startoftext|>", vocab)

    def test_stages_match_reference(self):
        text = load_stage(os.path.join(self.st_dir, "text_encoder.pt"))
        unet = load_stage(os.path.join(self.st_dir, "unet.pt"))
        vae = load_stage(os.path.join(self.st_dir, "vae_decoder.pt"))
        worst = {"cond": 0.0, "unet": 0.0, "vae": 0.0}
        with torch.no_grad():
            for case in self.cases:
                for ids, ref in (("tokens.npy", "cond.npy"), ("uncond_tokens.npy", "uncond.npy")):
                    worst["cond"] = max(worst["cond"], max_abs(text(torch.from_numpy(self.case(case, ids))),
                                                               self.case(case, ref)))
                xs, ts = self.case(case, "unet_x.npy"), self.case(case, "unet_t.npy")
                outs = self.case(case, "unet_out.npy")
                ctx = torch.from_numpy(self.case(case, "unet_context.npy"))
                for k in sorted({0, len(xs) // 2, len(xs) - 1}):
                    out = unet(torch.from_numpy(xs[k]), torch.from_numpy(ts[k]), ctx)
                    worst["unet"] = max(worst["unet"], max_abs(out, outs[k]))
                z = torch.from_numpy(self.case(case, "latents.npy")) / 0.18215
                worst["vae"] = max(worst["vae"], max_abs(vae(z), self.case(case, "decoded.npy")))
        print(f"\n  tiny2 max abs diffs {worst}", file=sys.stderr)
        self.assertLessEqual(worst["cond"], 1e-4)
        self.assertLessEqual(worst["unet"], 2e-4)
        self.assertLessEqual(worst["vae"], 1e-3)

    def test_linear_projections_and_head_size(self):
        unet = load_stage(os.path.join(self.st_dir, "unet.pt"))
        sd = unet.state_dict()
        self.assertEqual(tuple(sd["input_blocks.1.1.proj_in.weight"].shape), (32, 32))
        heads = [(s.heads, s.dim_head) for _, s in unet.named_modules() if hasattr(s, "dim_head")]
        self.assertTrue(heads and all(d == 16 for _, d in heads), heads)

    def test_ckpt_export_has_identical_weights(self):
        self.assert_same_weights(self.st_dir, self.ckpt_dir)
        self.assert_same_model_json(self.st_dir, self.ckpt_dir)

    def test_eps_config_and_override(self):
        eps = self.export("eps", self.st_file, "--config", os.path.join(self.fx, "v2-tiny.yaml"), *self.text)
        info = read_json(os.path.join(eps, "model.json"))
        self.assertEqual((info["parameterization"], info["parameterization_source"]), ("eps", "config v2-tiny.yaml"))
        self.assert_same_weights(self.st_dir, eps)
        over = self.export("override", self.st_file, *self.v_cfg, "--parameterization", "eps")
        info = read_json(os.path.join(over, "model.json"))
        self.assertEqual((info["parameterization"], info["parameterization_source"]), ("eps", "--parameterization"))

    def test_without_config_is_detected_as_sd2(self):
        r = run_export(self.st_file, "--out", os.path.join(self.tmp.name, "noconfig"))
        self.assertEqual(r.returncode, 1)
        line = r.stderr.strip().splitlines()[-1]
        self.assertIn("tiny2.safetensors", line)
        self.assertIn("SD 2.x defaults", line)
        self.assertNotIn("Traceback", r.stderr)

    def test_config_of_the_other_family_is_refused(self):
        tiny = fixture_dir("tiny", "v1-tiny.yaml")
        r = run_export(self.st_file, "--config", os.path.join(tiny, "v1-tiny.yaml"), "--out",
                       os.path.join(self.tmp.name, "wrongfamily"))
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("SD 2.x checkpoint", r.stderr)

    def test_random_init_sd2(self):
        out = self.export("random2", "--random-init", *self.v_cfg)
        info = read_json(os.path.join(out, "model.json"))
        self.assertEqual((info["family"], info["parameterization"], info["pad_id"]), ("sd2", "v", 0))

    def test_shared_ckpt(self):
        shared = os.path.join(REPO, "..", "shared", "conformance", "tiny2", "tiny2.ckpt")
        if not os.path.isfile(shared):
            self.skipTest("no shared tiny2.ckpt")
        self.assert_same_weights(self.st_dir, self.export("shared_ckpt", shared, *self.v_cfg))


class DiffusersNamesTest(unittest.TestCase):
    """The reader's names for the SD 1.5 UNet and VAE, against diffusers' published layout."""

    def test_known_sd15_names(self):
        dl = diffusers_layout
        unet = {"input_blocks.0.0.weight": "conv_in.weight",
                "time_embed.2.bias": "time_embedding.linear_2.bias",
                "input_blocks.1.0.in_layers.0.weight": "down_blocks.0.resnets.0.norm1.weight",
                "input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight":
                    "down_blocks.0.attentions.1.transformer_blocks.0.attn2.to_k.weight",
                "input_blocks.3.0.op.weight": "down_blocks.0.downsamplers.0.conv.weight",
                "input_blocks.4.0.skip_connection.bias": "down_blocks.1.resnets.0.conv_shortcut.bias",
                "input_blocks.11.0.emb_layers.1.weight": "down_blocks.3.resnets.1.time_emb_proj.weight",
                "middle_block.0.out_layers.3.weight": "mid_block.resnets.0.conv2.weight",
                "middle_block.1.proj_in.weight": "mid_block.attentions.0.proj_in.weight",
                "middle_block.2.in_layers.2.bias": "mid_block.resnets.1.conv1.bias",
                "output_blocks.2.1.conv.weight": "up_blocks.0.upsamplers.0.conv.weight",
                "output_blocks.5.2.conv.weight": "up_blocks.1.upsamplers.0.conv.weight",
                "output_blocks.5.1.proj_out.bias": "up_blocks.1.attentions.2.proj_out.bias",
                "output_blocks.8.0.skip_connection.weight": "up_blocks.2.resnets.2.conv_shortcut.weight",
                "output_blocks.11.1.transformer_blocks.0.ff.net.0.proj.weight":
                    "up_blocks.3.attentions.2.transformer_blocks.0.ff.net.0.proj.weight",
                "out.0.weight": "conv_norm_out.weight", "out.2.bias": "conv_out.bias"}
        for ldm, hf in unet.items():
            self.assertEqual(dl.unet_key(ldm, 2), hf, ldm)
        vae = {"post_quant_conv.weight": "post_quant_conv.weight",
               "decoder.norm_out.bias": "decoder.conv_norm_out.bias",
               "decoder.mid.block_1.conv1.weight": "decoder.mid_block.resnets.0.conv1.weight",
               "decoder.mid.attn_1.q.weight": "decoder.mid_block.attentions.0.to_q.weight",
               "decoder.mid.attn_1.proj_out.bias": "decoder.mid_block.attentions.0.to_out.0.bias",
               "decoder.up.2.upsample.conv.weight": "decoder.up_blocks.1.upsamplers.0.conv.weight",
               "decoder.up.1.block.0.conv1.bias": "decoder.up_blocks.2.resnets.0.conv1.bias",
               "decoder.up.0.block.0.nin_shortcut.weight": "decoder.up_blocks.3.resnets.0.conv_shortcut.weight"}
        for ldm, hf in vae.items():
            self.assertEqual(dl.vae_key(ldm, 4), hf, ldm)
        self.assertEqual(dl.vae_key("decoder.mid.attn_1.norm.weight", 4, old_attention_names=True),
                         "decoder.mid_block.attentions.0.group_norm.weight")
        self.assertEqual(dl.vae_key("decoder.mid.attn_1.v.bias", 4, old_attention_names=True),
                         "decoder.mid_block.attentions.0.value.bias")


class DiffusersRoundTripTest(Exports):
    """single file -> diffusers folder (inverse mapping) -> export == export of the single file."""

    def round_trip(self, fx_name, st_name, yaml_name, fmt, old_attention_names):
        fx = fixture_dir(fx_name, st_name)
        st_file = os.path.join(fx, st_name)
        sizes = ["--config", os.path.join(fx, yaml_name), "--text-config", os.path.join(fx, "text_encoder.json")]
        single = self.export(fx_name + "-single", st_file, *sizes)
        folder = os.path.join(self.tmp.name, fx_name + "-diffusers")
        ldm = load_ldm_config(os.path.join(fx, yaml_name))
        text = load_text_config(os.path.join(fx, "text_encoder.json"))
        text["layers"] = text["layers_total"] - (1 if ldm["text_layer"] == "penultimate" else 0)
        diffusers_writer.write_diffusers(read_tensors(st_file), ldm, text, folder, fmt, old_attention_names)
        from_folder = self.export(fx_name + "-from-diffusers", folder)
        self.assert_same_weights(single, from_folder)
        self.assert_same_model_json(single, from_folder)
        return folder, from_folder

    def test_sd1_safetensors(self):
        self.round_trip("tiny", "tiny.safetensors", "v1-tiny.yaml", "safetensors", False)

    def test_sd2_v_bin_with_old_attention_names(self):
        folder, out = self.round_trip("tiny2", "tiny2.safetensors", "v2-tiny-v.yaml", "bin", True)
        info = read_json(os.path.join(out, "model.json"))
        self.assertEqual((info["family"], info["parameterization"], info["pad_id"]), ("sd2", "v", 0))
        self.assertIn("scheduler_config.json", info["parameterization_source"])

        # Bad folders: one line naming what is wrong.
        def fails(path, must):
            r = run_export(path, "--out", os.path.join(self.tmp.name, "bad"))
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(must, r.stderr)
            self.assertNotIn("Traceback", r.stderr)

        broken = os.path.join(self.tmp.name, "broken")
        shutil.copytree(folder, broken)
        sched = os.path.join(broken, "scheduler", "scheduler_config.json")
        cfg = read_json(sched)
        cfg["beta_schedule"] = "squaredcos_cap_v2"
        with open(sched, "w") as f:
            json.dump(cfg, f)
        fails(broken, "beta_schedule")
        shutil.rmtree(os.path.join(broken, "unet"))
        fails(broken, "unet")
        fails(os.path.join(folder, "unet"), "not a diffusers folder")


if __name__ == "__main__":
    unittest.main()
