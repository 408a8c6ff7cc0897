"""The export side of img2img and inpainting (issue 33): the VAE encoder stage and the
9-channel inpainting UNet, against the reference fixtures of ../shared/conformance/img2img
and ../shared/conformance/inpaint (their READMEs give the tolerances used here).

Run from tests/python with the export package on the path (CTest: python_img2img_export_tests):
    cd tests/python && PYTHONPATH=../../python /usr/bin/python3 -m unittest -v export_img2img_inpaint
Tests that need the shared fixtures are skipped where they are absent (a plain clone); the
others make their inputs from tests/fixtures/tiny.
"""

import json
import os
import unittest

import numpy as np
import torch
import yaml

import diffusers_writer
from check_sd2_export import Exports as ExportsBase
from sd_export.configs import detect_unet_shapes, load_ldm_config, load_text_config
from sd_export.safetensors_io import read_tensors, write_safetensors
from sd_export.stages import load_stage
from test_export import max_abs, run_export, set_attention

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
SHARED = os.environ.get("SD_SHARED_CONFORMANCE") or os.path.join(REPO, "..", "shared", "conformance")
TINY = os.path.join(FIXTURES, "tiny")
INPAINT = os.path.join(SHARED, "inpaint")
IMG2IMG = os.path.join(SHARED, "img2img")
MOMENTS_TOL = 1e-4  # "encoder moments <= 1e-4" (both READMEs)
UNET_CALL_TOL = 2e-4  # "one UNet call <= 2e-4"
TINY_SIZES = ["--config", os.path.join(TINY, "v1-tiny.yaml"), "--text-config", os.path.join(TINY, "text_encoder.json")]


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def cases(folder):
    root = os.path.join(folder, "cases")
    return sorted(os.path.join(root, d) for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def need(path):
    if not os.path.exists(path):
        raise unittest.SkipTest(f"no {path} (the shared conformance fixtures are not beside this checkout)")


class Exports(ExportsBase):
    """A temporary folder, exports into it (check_sd2_export's), and the moments check."""

    def assert_moments(self, encoder, image_file, moments_file, what):
        """The encoder's moments of every row of image_file against moments_file (as many rows,
        or one row when the reference encodes its single picture once)."""
        image = torch.from_numpy(np.load(image_file))
        ref = np.load(moments_file)
        if ref.shape[0] == 1:
            image = image[:1]
        with torch.no_grad():
            got = encoder(image).numpy()
        self.assertEqual(got.shape, ref.shape, what)
        err = max_abs(got, ref)
        self.assertLessEqual(err, MOMENTS_TOL, what)
        return err


class TinyEncoderStage(Exports):
    """The encoder of the tiny SD 1.x model (tests/fixtures/tiny = ../tiny of the fixtures)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = cls.export("tiny", os.path.join(TINY, "tiny.safetensors"), *TINY_SIZES)

    def test_model_json_names_the_encoder_and_the_unet_input(self):
        info = read_json(os.path.join(self.model, "model.json"))
        self.assertEqual(info["files"]["vae_encoder"], "vae_encoder.pt")
        self.assertEqual((info["unet_in_channels"], info["latent_channels"]), (4, 4))
        for name in ("vae_encoder.pt", "vae_encoder.weights"):
            self.assertTrue(os.path.isfile(os.path.join(self.model, name)), name)

    def test_encoder_reproduces_the_img2img_moments(self):
        need(IMG2IMG)
        encoder = load_stage(os.path.join(self.model, "vae_encoder.pt"))
        checked = 0
        for case in cases(IMG2IMG):
            with self.subTest(os.path.basename(case)):
                self.assert_moments(encoder, os.path.join(case, "init_image.npy"),
                                    os.path.join(case, "encoder_moments.npy"), case)
                checked += 1
        self.assertGreaterEqual(checked, 8)

    def test_every_attention_mode_gives_the_moments(self):
        # The mid block's AttnBlock is the decoder's: the C++ side sets the same attributes.
        need(IMG2IMG)
        encoder = load_stage(os.path.join(self.model, "vae_encoder.pt"))
        case = cases(IMG2IMG)[0]
        for mode, chunk in ((0, 256), (1, 256), (2, 7), (3, 256)):
            with self.subTest(mode=mode):
                self.assertEqual(set_attention(encoder, mode, chunk), 1)  # the mid block's only
                self.assert_moments(encoder, os.path.join(case, "init_image.npy"),
                                    os.path.join(case, "encoder_moments.npy"), f"attention_mode {mode}")

    def test_encoder_of_the_four_channel_inpaint_cases(self):
        # The i4_* cases run ../tiny: its encoder gives their init and masked-picture moments.
        need(INPAINT)
        encoder = load_stage(os.path.join(self.model, "vae_encoder.pt"))
        four = [c for c in cases(INPAINT) if os.path.basename(c).startswith("i4_")]
        self.assertTrue(four)
        for case in four:
            with self.subTest(os.path.basename(case)):
                self.assert_moments(encoder, os.path.join(case, "init_image.npy"),
                                    os.path.join(case, "encoder_moments.npy"), case)
                self.assert_moments(encoder, os.path.join(case, "masked_image.npy"),
                                    os.path.join(case, "masked_image_encoder_moments.npy"), case)

    def test_fp16_weights_compute_the_same_in_fp32(self):
        # The fixture's weights are fp16-representable: an fp16 export holds the same values.
        model = self.export("tiny-f16", os.path.join(TINY, "tiny.safetensors"), "--dtype", "float16", *TINY_SIZES)
        half = load_stage(os.path.join(model, "vae_encoder.pt"))
        full = load_stage(os.path.join(self.model, "vae_encoder.pt"))
        self.assertTrue(all(p.dtype == torch.float16 for p in half.parameters()))
        x = torch.rand(1, 3, 32, 48) * 2 - 1
        with torch.no_grad():
            self.assertTrue(torch.equal(half(x), full(x)))

    def test_checkpoint_without_encoder_exports_for_text_to_image(self):
        tensors = read_tensors(os.path.join(TINY, "tiny.safetensors"))
        stripped = os.path.join(self.tmp.name, "no_encoder.safetensors")
        write_safetensors(stripped, [(k, v) for k, v in tensors.items()
                                     if not k.startswith(("first_stage_model.encoder.",
                                                          "first_stage_model.quant_conv."))])
        out = os.path.join(self.tmp.name, "no_encoder")
        r = run_export(stripped, "--out", out, *TINY_SIZES)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("has no VAE encoder weights", r.stderr)
        info = read_json(os.path.join(out, "model.json"))
        self.assertNotIn("vae_encoder", info["files"])
        self.assertFalse(os.path.exists(os.path.join(out, "vae_encoder.pt")))
        # The other stages are those of the full export.
        for stage in ("unet.pt", "vae_decoder.pt"):
            a = load_stage(os.path.join(out, stage)).state_dict()
            b = load_stage(os.path.join(self.model, stage)).state_dict()
            self.assertTrue(all(torch.equal(a[k], b[k]) for k in b), stage)


class InpaintExport(Exports):
    """The 9-channel tiny inpainting model of ../shared/conformance/inpaint."""

    @classmethod
    def setUpClass(cls):
        need(os.path.join(INPAINT, "tiny_inpaint.safetensors"))
        super().setUpClass()
        cls.ckpt = os.path.join(INPAINT, "tiny_inpaint.safetensors")
        cls.sizes = ["--config", os.path.join(INPAINT, "v1-tiny-inpainting.yaml"),
                     "--text-config", os.path.join(TINY, "text_encoder.json")]
        cls.model = cls.export("inpaint", cls.ckpt, *cls.sizes)
        cls.nine = [c for c in cases(INPAINT) if os.path.basename(c).startswith("i9_")]

    def test_model_json_records_the_nine_channel_unet(self):
        info = read_json(os.path.join(self.model, "model.json"))
        self.assertEqual(info["unet_in_channels"], 9)
        self.assertEqual(info["latent_channels"], 4)  # what the UNet predicts and the VAE takes
        self.assertEqual(info["architecture"]["unet"]["in_channels"], 9)
        self.assertEqual(info["files"]["vae_encoder"], "vae_encoder.pt")

    def test_unet_reproduces_the_recorded_nine_channel_calls(self):
        unet = load_stage(os.path.join(self.model, "unet.pt"))
        self.assertTrue(self.nine)
        for case in self.nine:
            x, t = np.load(os.path.join(case, "unet_x.npy")), np.load(os.path.join(case, "unet_t.npy"))
            ref, context = np.load(os.path.join(case, "unet_out.npy")), np.load(os.path.join(case, "unet_context.npy"))
            self.assertEqual(x.shape[2], 9)
            with self.subTest(os.path.basename(case)), torch.no_grad():
                got = unet(torch.from_numpy(x[0]), torch.from_numpy(t[0]), torch.from_numpy(context)).numpy()
                self.assertLessEqual(max_abs(got, ref[0]), UNET_CALL_TOL)

    def test_encoder_reproduces_the_inpaint_moments(self):
        encoder = load_stage(os.path.join(self.model, "vae_encoder.pt"))
        checked = 0
        for case in self.nine:
            pairs = [("masked_image.npy", "masked_image_encoder_moments.npy")]
            if os.path.exists(os.path.join(case, "encoder_moments.npy")):  # strength < 1 encodes the picture
                pairs.append(("init_image.npy", "encoder_moments.npy"))
            for image, moments in pairs:
                with self.subTest(os.path.basename(case) + " " + image):
                    self.assert_moments(encoder, os.path.join(case, image), os.path.join(case, moments), case)
                    checked += 1
        self.assertGreaterEqual(checked, 6)

    def test_diffusers_inpaint_folder_gives_the_same_model(self):
        ldm = load_ldm_config(os.path.join(INPAINT, "v1-tiny-inpainting.yaml"))
        text = load_text_config(os.path.join(TINY, "text_encoder.json"))
        folder = os.path.join(self.tmp.name, "inpaint-diffusers")
        diffusers_writer.write_diffusers(read_tensors(self.ckpt), ldm, text, folder)
        self.assertEqual(read_json(os.path.join(folder, "unet", "config.json"))["in_channels"], 9)
        out = self.export("inpaint-from-diffusers", folder)
        for stage in ("text_encoder.pt", "unet.pt", "vae_decoder.pt", "vae_encoder.pt"):
            a = load_stage(os.path.join(self.model, stage)).state_dict()
            b = load_stage(os.path.join(out, stage)).state_dict()
            self.assertEqual(sorted(a), sorted(b), stage)
            self.assertTrue(all(torch.equal(a[k], b[k]) for k in a), stage)
        self.assertEqual(read_json(os.path.join(out, "model.json"))["unet_in_channels"], 9)

    def test_inpainting_checkpoint_with_the_plain_config_is_one_line(self):
        out = os.path.join(self.tmp.name, "wrong-config")
        r = run_export(self.ckpt, "--out", out, *TINY_SIZES)
        self.assertEqual(r.returncode, 1)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("tiny_inpaint.safetensors's UNet takes 9 input channels (inpainting)", lines[0])
        self.assertIn("in_channels 4", lines[0])
        self.assertFalse(os.path.exists(out))


class UnetInputKinds(Exports):
    """Made from tests/fixtures/tiny alone: the input channels read from the checkpoint,
    and the kinds the export refuses."""

    def checkpoint_with_input(self, channels):
        tensors = read_tensors(os.path.join(TINY, "tiny.safetensors"))
        key = "model.diffusion_model.input_blocks.0.0.weight"
        w = tensors[key]
        tensors[key] = torch.cat([w, torch.zeros(w.shape[0], channels - w.shape[1], *w.shape[2:])], 1)
        path = os.path.join(self.tmp.name, f"tiny_in{channels}.safetensors")
        write_safetensors(path, list(tensors.items()))
        with open(os.path.join(TINY, "v1-tiny.yaml"), encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
        cfg["model"]["params"]["unet_config"]["params"]["in_channels"] = channels
        config = os.path.join(self.tmp.name, f"v1-tiny-in{channels}.yaml")
        with open(config, "w", encoding="utf-8") as f:
            yaml.safe_dump(cfg, f)
        return path, config

    def test_a_nine_channel_checkpoint_exports_as_inpainting(self):
        path, config = self.checkpoint_with_input(9)
        out = self.export("in9", path, "--config", config, "--text-config", os.path.join(TINY, "text_encoder.json"))
        self.assertEqual(read_json(os.path.join(out, "model.json"))["unet_in_channels"], 9)
        unet = load_stage(os.path.join(out, "unet.pt"))
        with torch.no_grad():
            eps = unet(torch.randn(1, 9, 8, 8), torch.tensor([500]), torch.randn(1, 77, 32))
        self.assertEqual(tuple(eps.shape), (1, 4, 8, 8))

    def test_other_input_channel_counts_are_refused(self):
        path, config = self.checkpoint_with_input(5)  # as SD 2.x depth models
        r = run_export(path, "--config", config, "--text-config", os.path.join(TINY, "text_encoder.json"),
                       "--out", os.path.join(self.tmp.name, "in5"))
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("UNet in_channels 5 is not one this tool runs: 4 (text to image) or 9 (inpainting)", r.stderr)

    def test_input_channels_come_from_the_weights_without_a_config(self):
        class Shapes:  # a full-size checkpoint's keys, as the readers give them
            def __init__(self, shapes):
                self.shapes = shapes

            def keys(self):
                return list(self.shapes)

            def shape(self, key):
                return self.shapes[key]

        inpaint = Shapes({"model.diffusion_model.input_blocks.0.0.weight": (320, 9, 3, 3),
                          "model.diffusion_model.input_blocks.1.1.proj_in.weight": (320, 320, 1, 1)})
        self.assertEqual(detect_unet_shapes(inpaint), {"in_channels": 9, "use_linear_in_transformer": False})
        plain = Shapes({"model.diffusion_model.input_blocks.0.0.weight": (320, 4, 3, 3),
                        "model.diffusion_model.input_blocks.1.1.proj_in.weight": (320, 320)})
        self.assertEqual(detect_unet_shapes(plain), {"in_channels": 4, "use_linear_in_transformer": True})


if __name__ == "__main__":
    unittest.main()
