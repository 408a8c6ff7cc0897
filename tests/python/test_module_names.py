"""The TorchScript names of the export's modules: every class and function of the
sd_export.modules package is __torch__.sd_modules.NAME, the name model folders already
written carry and src/io/op_allowlist.inc lists, whichever file of the package holds it."""

import inspect
import io
import unittest
import zipfile

import torch
from torch._jit_internal import _qualified_name

from sd_export import modules
from sd_export.modules import layers, text, unet, vae


class ModuleNames(unittest.TestCase):
    def test_every_class_and_function_keeps_the_sd_modules_name(self):
        seen = 0
        for module in (layers, text, unet, vae):
            for name, value in vars(module).items():
                if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == module.__name__:
                    with self.subTest(f"{module.__name__}.{name}"):
                        self.assertEqual(_qualified_name(value), f"__torch__.sd_modules.{name}")
                        self.assertIn("_jit_override_qualname", vars(value))  # its own, not a parent's
                    seen += 1
        self.assertGreater(seen, 40)

    def test_python_sees_the_real_files(self):
        self.assertEqual(modules.VAEEncoder.__module__, "sd_export.modules.vae")
        self.assertIn("class VAEEncoder", inspect.getsource(modules.VAEEncoder))

    def test_scripted_code_lives_under_sd_modules(self):
        enc = modules.VAEEncoder(ch=32, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(16,), resolution=32)
        buf = io.BytesIO()
        torch.jit.save(torch.jit.script(enc.eval()), buf)
        with zipfile.ZipFile(buf) as z:
            code = [n.split("/", 1)[1] for n in z.namelist() if "/code/__torch__/" in n and not n.endswith(".debug_pkl")]
        ours = [n for n in code if not n.startswith("code/__torch__/torch/")]
        self.assertIn("code/__torch__/sd_modules.py", ours)
        self.assertTrue(all(n.startswith("code/__torch__/sd_modules") for n in ours), ours)


if __name__ == "__main__":
    unittest.main()
