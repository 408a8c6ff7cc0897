"""The exported ResNet blocks on the blocked route (the C++ sd_blocked operators of
libsd_engine.so, SD_ENGINE_LIB) against the same scripted modules on their own plain
code, for every block type: the UNet's ResBlock with and without a channel change,
followed by a transformer or not, Upsample, Downsample; the VAE's ResnetBlock,
VAEUpsample, VAEDownsample; and chains of them passing blocked tensors on, as the
UNet and the VAE do. Odd image sizes included (channel counts that are not whole
blocks cannot occur behind 32-group norms: tests/kernels/test_blocked_blocks.cpp
covers them on the operators). Skipped without the library."""

import os
import unittest

import torch

ENGINE = os.environ.get("SD_ENGINE_LIB", "")
# Before sd_export: it defines Python versions of the operators unless the C++ ones exist.
if ENGINE and os.path.exists(ENGINE):
    torch.ops.load_library(ENGINE)

import sd_export.modules as M  # noqa: E402
from sd_export.modules.layers import plain_layout  # noqa: E402
TOLERANCE = 2e-5


def blocks_here():
    """The blocks the C++ operators accept on this CPU (16: AVX-512, 8: AVX2)."""
    here = []
    for block in (16, 8):
        try:
            torch.ops.sd_blocked.to_plain(torch.ops.sd_blocked.upsample(
                torch.zeros(1, block, 1, 1), torch.zeros(block, block, 3, 3), None, block, block, False))
            here.append(block)
        except RuntimeError:
            pass
    return here


def randomize(module):
    torch.manual_seed(sum(p.numel() for p in module.parameters()))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("weight") and p.dim() == 1:  # norms
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 4:
                p.copy_(torch.randn_like(p) / (p[0].numel() ** 0.5))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return module.eval()


def rel_diff(got, want):
    got = plain_layout(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    return ((got - want).abs().max() / max(1.0, want.abs().max().item())).item()


@unittest.skipUnless(ENGINE and os.path.exists(ENGINE), "SD_ENGINE_LIB (libsd_engine.so) not given")
class BlockedModules(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.blocks = blocks_here()

    def compare(self, module, *args):
        """The module on the blocked route (each block here) against its own code."""
        scripted = torch.jit.script(randomize(module))
        with torch.no_grad():
            want = scripted(*args)
            self.assertEqual(want.dim(), 4)
            for block in self.blocks:
                scripted.blocked = block
                got = scripted(*args)
                scripted.blocked = 0
                with self.subTest(module=type(module).__name__, block=block, shape=tuple(args[0].shape)):
                    self.assertLessEqual(rel_diff(got, want), TOLERANCE)
                    # A blocked result only where the channels fill whole blocks and no plain layer follows.
                    plain_out = getattr(module, "plain_out", False)
                    self.assertEqual(got.dim(), 5 if not plain_out and want.shape[1] % block == 0 else 4)

    def test_there_is_a_route(self):
        self.assertTrue(self.blocks, "no blocked route on this CPU")

    def test_unet_blocks(self):
        emb = torch.randn(2, 64)
        ctx = torch.zeros(1)
        for size in (7, 8):
            x = torch.randn(2, 32, size, size + 1) * 2 + 0.5
            self.compare(M.ResBlock(32, 64, 32), x, emb, ctx)  # same channels: x is the skip
            self.compare(M.ResBlock(32, 64, 64), x, emb, ctx)  # 1x1 skip conv
            self.compare(M.ResBlock(32, 64, 64, True), x, emb, ctx)  # a transformer follows: plain out
            self.compare(M.Upsample(32), x, emb, ctx)
            self.compare(M.Downsample(32), x, emb, ctx)

    def test_vae_blocks(self):
        for size in (7, 8):
            x = torch.randn(1, 64, size, size) * 2 - 0.5
            self.compare(M.ResnetBlock(64, 64), x)
            self.compare(M.ResnetBlock(64, 32), x)  # nin_shortcut
            self.compare(M.ResnetBlock(64, 64, True), x)
            self.compare(M.VAEUpsample(64), x)
            self.compare(M.VAEDownsample(64), x)

    def test_chains_pass_blocked_tensors_on(self):
        # UNet-like: ResBlock -> Downsample -> ResBlock -> Upsample -> concatenation with the first output
        # -> ResBlock, then the VAE-like Decoder level; all switched, against all plain.
        emb = torch.randn(2, 64)
        ctx = torch.zeros(1)
        mods = [torch.jit.script(randomize(m)) for m in
                (M.ResBlock(32, 64, 32), M.Downsample(32), M.ResBlock(32, 64, 64), M.Upsample(64),
                 M.ResBlock(96, 64, 32))]
        x = torch.randn(2, 32, 9, 9)

        def run():
            a = mods[0](x, emb, ctx)
            b = mods[3](mods[2](mods[1](a, emb, ctx), emb, ctx), emb, ctx)
            b = b[:, :, :9, :9] if b.dim() == 4 else b[:, :, :9, :9, :]
            return mods[4](torch.cat([b, a], 1), emb, ctx)

        with torch.no_grad():
            want = run()
            for block in self.blocks:
                for m in mods:
                    m.blocked = block
                got = run()
                for m in mods:
                    m.blocked = 0
                self.assertEqual(got.dim(), 5)
                self.assertLessEqual(rel_diff(got, want), TOLERANCE, block)


if __name__ == "__main__":
    unittest.main()
