"""The VAE decoder: ``VAEDecoder`` <- ``first_stage_model.`` (AutoencoderKL's post_quant_conv
and decoder), built from the layers of layers.py."""

from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from .layers import DEFAULT_ATTENTION_CHUNK, DEFAULT_ATTENTION_MODE, Conv2d, GroupNorm


def vae_norm(channels: int) -> GroupNorm:
    return GroupNorm(32, channels, eps=1e-6, affine=True)


def swish(x: torch.Tensor) -> torch.Tensor:
    # The reference's nonlinearity, written out (not F.silu) to keep its rounding.
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.norm1 = vae_norm(in_channels)
        self.conv1 = Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = vae_norm(out_channels)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = Conv2d(in_channels, out_channels, 1)
        else:
            self.nin_shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        return self.nin_shortcut(x) + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention of the VAE (1x1 conv q, k, v, proj_out)."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = vae_norm(channels)
        self.q = Conv2d(channels, channels, 1)
        self.k = Conv2d(channels, channels, 1)
        self.v = Conv2d(channels, channels, 1)
        self.proj_out = Conv2d(channels, channels, 1)
        self.attention_mode: int = DEFAULT_ATTENTION_MODE
        self.attention_chunk: int = DEFAULT_ATTENTION_CHUNK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h_ = self.norm(x)
        q = self.q(h_)
        k = self.k(h_)
        v = self.v(h_)
        b, c, hh, ww = q.shape
        n = hh * ww
        q = q.reshape(b, c, n).permute(0, 2, 1)  # b, n, c
        k = k.reshape(b, c, n)                   # b, c, n
        v = v.reshape(b, c, n)
        scale = int(c) ** (-0.5)
        if self.attention_mode == 3:  # fused operator: tokens x channels, one head
            h_ = torch.ops.sd.attention(q, k.permute(0, 2, 1), v.permute(0, 2, 1), 1, scale)
            return x + self.proj_out(h_.permute(0, 2, 1).reshape(b, c, hh, ww))
        k32 = k.float()  # scores and softmax in fp32 under half compute (CrossAttention._attend)
        # One head only, so modes 0 and 1 are the same computation.
        chunk = n
        if self.attention_mode == 2 and self.attention_chunk > 0:  # chunked
            chunk = self.attention_chunk
        if chunk >= n:
            w_ = torch.softmax(torch.bmm(q.float(), k32) * scale, dim=2).to(v.dtype)
            h_ = torch.bmm(v, w_.permute(0, 2, 1))
        else:
            h_ = torch.empty((b, c, n), dtype=q.dtype, device=q.device)
            for start in range(0, n, chunk):
                w_ = torch.softmax(torch.bmm(q[:, start:start + chunk].float(), k32) * scale, dim=2).to(v.dtype)
                h_[:, :, start:start + chunk] = torch.bmm(v, w_.permute(0, 2, 1))
        return x + self.proj_out(h_.reshape(b, c, hh, ww))


class VAEUpsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DecoderMid(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels)
        self.attn_1 = AttnBlock(channels)
        self.block_2 = ResnetBlock(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class DecoderLevel(nn.Module):
    """decoder.up.{i}: ResnetBlocks, each followed by an AttnBlock where the level has attention."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int, with_attn: bool, with_upsample: bool):
        super().__init__()
        self.block = nn.ModuleList()
        self.attn = nn.ModuleList()
        for _ in range(num_blocks):
            self.block.append(ResnetBlock(in_channels, out_channels))
            in_channels = out_channels
            if with_attn:
                self.attn.append(AttnBlock(out_channels))
        self.upsample = VAEUpsample(out_channels) if with_upsample else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # attn[i] follows block[i]; TorchScript cannot index a ModuleList with a
        # loop variable, so the (unrolled) inner loop picks the matching one.
        i = 0
        for block in self.block:
            x = block(x)
            j = 0
            for attn in self.attn:
                if j == i:
                    x = attn(x)
                j += 1
            i += 1
        return self.upsample(x)


class Decoder(nn.Module):
    def __init__(self, ch: int = 128, out_ch: int = 3, ch_mult=(1, 2, 4, 4), num_res_blocks: int = 2,
                 attn_resolutions=(), resolution: int = 256, z_channels: int = 4):
        super().__init__()
        levels = len(ch_mult)
        block_in = ch * ch_mult[-1]
        curr_res = resolution // 2 ** (levels - 1)
        self.conv_in = Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = DecoderMid(block_in)
        ups: List[nn.Module] = []
        for i_level in reversed(range(levels)):
            block_out = ch * ch_mult[i_level]
            ups.insert(0, DecoderLevel(block_in, block_out, num_res_blocks + 1,
                                       curr_res in attn_resolutions, i_level != 0))
            block_in = block_out
            if i_level != 0:
                curr_res *= 2
        # Indexed as in the checkpoint: up.0 is the finest level, run last.
        self.up = nn.ModuleList(ups)
        self.norm_out = vae_norm(block_in)
        self.conv_out = Conv2d(block_in, out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        # Coarsest level first.  (TorchScript accepts a reversed ModuleList only
        # with an explicit .forward call.)
        for level in self.up[::-1]:
            h = level.forward(h)
        return self.conv_out(swish(self.norm_out(h)))


class VAEDecoder(nn.Module):
    """AutoencoderKL.decode without scaling: forward(z) = decoder(post_quant_conv(z))."""

    def __init__(self, embed_dim: int = 4, ch: int = 128, out_ch: int = 3, ch_mult=(1, 2, 4, 4),
                 num_res_blocks: int = 2, attn_resolutions=(), resolution: int = 256, z_channels: int = 4):
        super().__init__()
        self.post_quant_conv = Conv2d(embed_dim, z_channels, 1)
        self.decoder = Decoder(ch, out_ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(z))
