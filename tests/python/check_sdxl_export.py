"""SDXL base export against the sdxl-tiny fixtures (Stability-AI's sgm on random weights):
the single file (with its yaml, and without) and the diffusers folder give the same
weights, and each stage reproduces the recorded arrays: CLIP-L's hidden state, bigG's
penultimate state and pooled vector, one UNet call with its vector input, the VAE decode.
Bad input: an SDXL file missing its second text encoder, a refiner (file and folder).

Fixtures: tests/fixtures/sdxl-tiny (or ../shared/conformance). Run by CTest as part of
python_sd2_export_tests (check_*.py).
"""

import os
import shutil
import unittest

import numpy as np
import torch

from check_sd2_export import Exports, fixture_dir, max_abs, read_json
from sd_export.safetensors_io import SafetensorsFile, write_safetensors
from test_export import load_stage, run_export

CASES = ("px1_euler10_64x64", "px2_euler12_64x96", "px3_dpmpp2m15_96x64", "px4_euler_a10_batch2_64x64")
STAGES = ("text_encoder.pt", "text_encoder_2.pt", "unet.pt", "vae_decoder.pt", "vae_encoder.pt")


class SdxlExport(Exports):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.fx = fixture_dir("sdxl-tiny", "sd_xl_base_tiny.safetensors")
        f = lambda name: os.path.join(cls.fx, name)  # noqa: E731
        cls.sizes = ["--text-config", f("clip_l_tiny.json"), "--text-config-2", f("openclip-bigG-tiny.json")]
        cls.st = cls.export("st", f("sd_xl_base_tiny.safetensors"), "--config", f("sd_xl_base_tiny.yaml"), *cls.sizes)
        cls.diffusers = cls.export("diffusers", f("diffusers"))

    def case(self, c, name):
        return torch.from_numpy(np.load(os.path.join(self.fx, "cases", c, name)))

    def test_single_file_and_diffusers_folder_give_the_same_model(self):
        self.assert_same_weights(self.st, self.diffusers, STAGES)
        a, b = read_json(os.path.join(self.st, "model.json")), read_json(os.path.join(self.diffusers, "model.json"))
        for key in ("sdxl", "family", "context_dim", "pad_id", "scale_factor", "text_layers_used", "alphas_cumprod",
                    "linear_start", "linear_end", "parameterization"):
            self.assertEqual(a[key], b[key], key)

    def test_defaults_are_sdxl_base(self):
        # Without a yaml a single file is built with these: sgm's sd_xl_base.yaml values
        # (bench/sd_xl_base.yaml), CLIP-L's hidden_states[11], all 32 bigG layers.
        from sd_export.configs import SD1_VAE, SDXL_SCHEDULE, SDXL_TEXT, SDXL_TEXT_2, SDXL_UNET, load_ldm_config
        from test_export import REPO
        base = load_ldm_config(os.path.join(REPO, "bench", "sd_xl_base.yaml"))
        self.assertEqual(base["unet"], SDXL_UNET)
        self.assertEqual(base["vae"], SD1_VAE)
        self.assertEqual(base["schedule"], SDXL_SCHEDULE)
        self.assertEqual(base["text_layer_idx"], SDXL_TEXT["layers"])
        self.assertEqual((SDXL_TEXT_2["width"], SDXL_TEXT_2["layers"], SDXL_TEXT_2["projection"]), (1280, 32, 1280))
        # A custom-sized file without its sizes is refused with the shapes, not exported wrongly.
        r = run_export(os.path.join(self.fx, "sd_xl_base_tiny.safetensors"), *self.sizes, "--out",
                       os.path.join(self.tmp.name, "refused"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("time_embed.0.weight [128, 32] (expected [1280, 320])", r.stderr)
        r = run_export(os.path.join(self.fx, "sd_xl_base_tiny.safetensors"), "--out",
                       os.path.join(self.tmp.name, "refused"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("--text-config-2", r.stderr)

    def test_model_json(self):
        info = read_json(os.path.join(self.st, "model.json"))
        self.assertEqual(info["family"], "sdxl")
        self.assertEqual(info["sdxl"], {"text_encoder_width": 32, "text_encoder_2_width": 48,
                                        "text_encoder_2_pad_id": 0, "pooled_dim": 48, "size_embedding_dim": 256,
                                        "adm_in_channels": 1584})
        self.assertEqual((info["context_dim"], info["pad_id"], info["text_layers_used"]), (80, 49407, 2))
        self.assertEqual(info["scale_factor"], 0.13025)
        self.assertEqual(info["files"]["text_encoder_2"], "text_encoder_2.pt")
        self.assertEqual((info["image_size"], info["default_sampler"], info["guidance_scale"]), (1024, "euler", 5.0))
        self.assertNotIn("default_steps", info)

    def test_turbo_file_records_the_turbo_recipe(self):
        turbo = os.path.join(self.tmp.name, "sd_xl_turbo_tiny.safetensors")
        os.symlink(os.path.join(self.fx, "sd_xl_base_tiny.safetensors"), turbo)
        out = self.export("turbo", turbo, "--config", os.path.join(self.fx, "sd_xl_base_tiny.yaml"), *self.sizes)
        info = read_json(os.path.join(out, "model.json"))
        got = {k: info.get(k) for k in ("image_size", "default_sampler", "default_schedule", "default_steps",
                                          "guidance_scale")}
        self.assertEqual(got, {"image_size": 512, "default_sampler": "euler_a", "default_schedule": "trailing",
                               "default_steps": 1, "guidance_scale": 1.0})
        # The user's flags win.
        out = self.export("turbo-4", turbo, "--config", os.path.join(self.fx, "sd_xl_base_tiny.yaml"), *self.sizes,
                          "--default-sampler", "euler_a", "--default-steps", "4", "--image-size", "768")
        info = read_json(os.path.join(out, "model.json"))
        self.assertEqual((info["default_steps"], info["image_size"], info.get("default_schedule")), (4, 768, None))

    def test_stages_reproduce_the_reference(self):
        for out in (self.st, self.diffusers):
            te1 = load_stage(os.path.join(out, "text_encoder.pt"))
            te2 = load_stage(os.path.join(out, "text_encoder_2.pt"))
            unet, vae = load_stage(os.path.join(out, "unet.pt")), load_stage(os.path.join(out, "vae_decoder.pt"))
            with torch.no_grad():
                for c in CASES:
                    self.assertLessEqual(max_abs(te1(self.case(c, "tokens_l.npy")), self.case(c, "emb_l.npy")), 1e-4, c)
                    hidden, pooled = te2.forward_pooled(self.case(c, "tokens_g.npy"))
                    self.assertLessEqual(max_abs(hidden, self.case(c, "emb_g.npy")), 1e-4, c)
                    self.assertLessEqual(max_abs(pooled, self.case(c, "pooled_g.npy")), 1e-4, c)
                    x, t = self.case(c, "unet_x.npy")[0], self.case(c, "unet_t.npy")[0]
                    ref = self.case(c, "unet_out.npy")[0]
                    out_eps = unet(x, t, self.case(c, "unet_context.npy"), self.case(c, "unet_y.npy"))
                    self.assertLessEqual(max_abs(out_eps, ref), 2e-4, c)
                    z = self.case(c, "latents.npy") / 0.13025
                    self.assertLessEqual(max_abs(vae(z), self.case(c, "decoded.npy")), 1e-3, c)
                # Must fail: the UNet without its vector input, which it needs.
                with self.assertRaises(Exception):
                    unet(x, t, self.case(CASES[-1], "unet_context.npy"))

    def write_without(self, name, drop, change=None):
        """A copy of the fixture file without the keys starting with `drop`."""
        src = SafetensorsFile(os.path.join(self.fx, "sd_xl_base_tiny.safetensors"))
        tensors = [(k, src.load(k)) for k in src.keys() if not k.startswith(drop)]
        src.close()
        if change:
            tensors = change(tensors)
        path = os.path.join(self.tmp.name, name)
        write_safetensors(path, tensors)
        return path

    def assert_refused(self, args, *words):
        r = run_export(*args, "--out", os.path.join(self.tmp.name, "refused"))
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        for w in words:
            self.assertIn(w, lines[0])
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "refused", "model.json")))

    def test_missing_second_text_encoder_is_refused(self):
        path = self.write_without("no-bigg.safetensors", "conditioner.embedders.1.")
        self.assert_refused([path, *self.sizes], "conditioner.embedders.1.model", "second text encoder")

    def test_refiner_is_refused(self):
        # The refiner's layout: bigG alone at embedders.0, another vector width (2560 in the real one).
        def as_refiner(tensors):
            out = []
            for k, t in tensors:
                k = k.replace("conditioner.embedders.1.", "conditioner.embedders.0.")
                if k == "model.diffusion_model.label_emb.0.0.weight":
                    t = torch.zeros(t.shape[0], 1328, dtype=t.dtype)
                out.append((k, t))
            return out
        path = self.write_without("refiner.safetensors", "conditioner.embedders.0.", as_refiner)
        self.assert_refused([path, *self.sizes], "SDXL refiner", "1328")
        folder = os.path.join(self.tmp.name, "refiner-folder")
        shutil.copytree(os.path.join(self.fx, "diffusers"), folder)
        shutil.rmtree(os.path.join(folder, "text_encoder"))
        self.assert_refused([folder], "SDXL refiner")

    def test_sd1_lora_on_sdxl_is_refused(self):
        # SDXL LoRAs are baked in (tests/CMakeLists.txt export_sdxl_lora); an SD 1.x one is named as such.
        sd1 = os.path.join(os.path.dirname(self.fx), "lora", "lora_a.safetensors")
        self.assert_refused([os.path.join(self.fx, "diffusers"), "--lora", sd1], "lora_a.safetensors",
                            "is a LoRA for SD 1.x or 2.x", "this model is SDXL")


if __name__ == "__main__":
    unittest.main()
