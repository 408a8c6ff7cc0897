"""The VAE, built from the layers of layers.py, both halves under ``first_stage_model.``:

* ``VAEDecoder``  AutoencoderKL's post_quant_conv and decoder (latents to pictures);
* ``VAEEncoder``  its encoder and quant_conv up to the posterior's moments (pictures to
  latents: img2img and inpainting); the Gaussian sample is the caller's, with its own
  generator, as the references draw it.

Both halves share the mid block's layout and its AttnBlock, so the encoder's attention
takes the same ``attention_mode`` / ``attention_chunk`` settings (and ``sd::attention``)
as the decoder's.
"""

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .layers import DEFAULT_ATTENTION_CHUNK, DEFAULT_ATTENTION_MODE, Conv2d, GroupNorm, plain_layout


def vae_norm(channels: int) -> GroupNorm:
    return GroupNorm(32, channels, eps=1e-6, affine=True)


def swish(x: torch.Tensor) -> torch.Tensor:
    # The reference's nonlinearity, written out (not F.silu) to keep its rounding.
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    """plain_out: attention follows, so the blocked route gives its result plain
    (layers.py plain_layout)."""

    def __init__(self, in_channels: int, out_channels: int, plain_out: bool = False):
        super().__init__()
        self.norm1 = vae_norm(in_channels)
        self.conv1 = Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = vae_norm(out_channels)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = Conv2d(in_channels, out_channels, 1)
        else:
            self.nin_shortcut = nn.Identity()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.blocked: int = 0  # layers.py: the blocked route, set from C++
        self.plain_out = plain_out

    def _blocked_forward(self, x: torch.Tensor) -> torch.Tensor:
        skip_w: Optional[torch.Tensor] = None
        skip_b: Optional[torch.Tensor] = None
        if hasattr(self.nin_shortcut, "weight"):
            skip_w = self.nin_shortcut.weight
            skip_b = self.nin_shortcut.bias
        return torch.ops.sd_blocked.resblock(
            x, None, self.norm1.weight, self.norm1.bias, self.norm1.eps, self.conv1.weight, self.conv1.bias,
            self.norm2.weight, self.norm2.bias, self.norm2.eps, self.conv2.weight, self.conv2.bias, skip_w, skip_b,
            self.norm1.num_groups, self.in_channels, self.out_channels, self.blocked, self.plain_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked > 0:
            return self._blocked_forward(x)
        x = plain_layout(x)
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
        self.channels = channels
        self.blocked: int = 0  # layers.py: the blocked route, set from C++

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked > 0:
            return torch.ops.sd_blocked.upsample(x, self.conv.weight, self.conv.bias, self.channels, self.blocked,
                                                 False)
        return self.conv(F.interpolate(plain_layout(x), scale_factor=2.0, mode="nearest"))


def at_mul(block: nn.Module, mul: int) -> nn.Module:
    """Marks the convolutions inside not yet marked as running at latent size x mul (layers.py)."""
    for m in block.modules():
        if isinstance(m, Conv2d) and m.latent_mul == 0:
            m.latent_mul = mul
    return block


class DecoderMid(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, True)  # attention follows: plain out
        self.attn_1 = AttnBlock(channels)
        self.block_2 = ResnetBlock(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class VAELevel(nn.Module):
    """One resolution of the VAE's encoder or decoder: ResnetBlocks, each followed by an
    AttnBlock where the level has attention. The subclasses add the resampling conv."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int, with_attn: bool):
        super().__init__()
        self.block = nn.ModuleList()
        self.attn = nn.ModuleList()
        for _ in range(num_blocks):
            self.block.append(ResnetBlock(in_channels, out_channels, with_attn))
            in_channels = out_channels
            if with_attn:
                self.attn.append(AttnBlock(out_channels))

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
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
        return x


class DecoderLevel(VAELevel):
    """decoder.up.{i}: the level's blocks, then the upsampling conv except at the finest level."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int, with_attn: bool, with_upsample: bool):
        super().__init__(in_channels, out_channels, num_blocks, with_attn)
        self.upsample = VAEUpsample(out_channels) if with_upsample else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.upsample(self.blocks(x))


class Decoder(nn.Module):
    def __init__(self, ch: int = 128, out_ch: int = 3, ch_mult=(1, 2, 4, 4), num_res_blocks: int = 2,
                 attn_resolutions=(), resolution: int = 256, z_channels: int = 4):
        super().__init__()
        levels = len(ch_mult)
        block_in = ch * ch_mult[-1]
        curr_res = resolution // 2 ** (levels - 1)
        self.conv_in = at_mul(Conv2d(z_channels, block_in, 3, padding=1), 1)
        self.mid = at_mul(DecoderMid(block_in), 1)
        ups: List[nn.Module] = []
        for i_level in reversed(range(levels)):
            block_out = ch * ch_mult[i_level]
            level = DecoderLevel(block_in, block_out, num_res_blocks + 1, curr_res in attn_resolutions, i_level != 0)
            mul = 2 ** (levels - 1 - i_level)
            at_mul(level.upsample, 2 * mul)  # its conv runs on the upsampled input
            ups.insert(0, at_mul(level, mul))
            block_in = block_out
            if i_level != 0:
                curr_res *= 2
        # Indexed as in the checkpoint: up.0 is the finest level, run last.
        self.up = nn.ModuleList(ups)
        self.norm_out = vae_norm(block_in)
        self.conv_out = at_mul(Conv2d(block_in, out_ch, 3, padding=1), 2 ** (levels - 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        # Coarsest level first.  (TorchScript accepts a reversed ModuleList only
        # with an explicit .forward call.)
        for level in self.up[::-1]:
            h = level.forward(h)
        return self.conv_out(swish(self.norm_out(plain_layout(h))))


class VAEDecoder(nn.Module):
    """AutoencoderKL.decode without scaling: forward(z) = decoder(post_quant_conv(z))."""

    def __init__(self, embed_dim: int = 4, ch: int = 128, out_ch: int = 3, ch_mult=(1, 2, 4, 4),
                 num_res_blocks: int = 2, attn_resolutions=(), resolution: int = 256, z_channels: int = 4):
        super().__init__()
        self.post_quant_conv = Conv2d(embed_dim, z_channels, 1)
        self.decoder = Decoder(ch, out_ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(z))


# --------------------------------------------------------------------------- encoder

class VAEDownsample(nn.Module):
    """The encoder's strided conv: padded by one pixel on the right and bottom only, then a
    3x3 conv with stride 2 and no padding of its own (the reference's asymmetric padding)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = Conv2d(channels, channels, 3, stride=2, padding=0)
        self.channels = channels
        self.blocked: int = 0  # layers.py: the blocked route, set from C++

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked > 0:
            return torch.ops.sd_blocked.downsample(x, self.conv.weight, self.conv.bias, self.channels, 0, 1,
                                                   self.blocked, False)
        return self.conv(F.pad(plain_layout(x), [0, 1, 0, 1], mode="constant", value=0.0))


class EncoderLevel(VAELevel):
    """encoder.down.{i}: the level's blocks, then the downsampling conv except at the coarsest level."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int, with_attn: bool, with_downsample: bool):
        super().__init__(in_channels, out_channels, num_blocks, with_attn)
        self.downsample = VAEDownsample(out_channels) if with_downsample else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.blocks(x))


class Encoder(nn.Module):
    """ldm's Encoder with double_z: [n, in_channels, H, W] -> [n, 2 * z_channels, H/f, W/f]."""

    def __init__(self, ch: int = 128, in_channels: int = 3, ch_mult=(1, 2, 4, 4), num_res_blocks: int = 2,
                 attn_resolutions=(), resolution: int = 256, z_channels: int = 4):
        super().__init__()
        self.conv_in = at_mul(Conv2d(in_channels, ch, 3, padding=1), 2 ** (len(ch_mult) - 1))
        levels: List[nn.Module] = []
        block_in = ch
        curr_res = resolution
        for i_level, mult in enumerate(ch_mult):
            last = i_level == len(ch_mult) - 1
            levels.append(at_mul(EncoderLevel(block_in, ch * mult, num_res_blocks, curr_res in attn_resolutions,
                                              not last), 2 ** (len(ch_mult) - 1 - i_level)))
            block_in = ch * mult
            if not last:
                curr_res //= 2
        # Indexed as in the checkpoint: down.0 is the finest level, run first.
        self.down = nn.ModuleList(levels)
        self.mid = at_mul(DecoderMid(block_in), 1)  # block_1, attn_1, block_2: the decoder's mid-block layout
        self.norm_out = vae_norm(block_in)
        self.conv_out = at_mul(Conv2d(block_in, 2 * z_channels, 3, padding=1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        return self.conv_out(swish(self.norm_out(plain_layout(self.mid(h)))))


class VAEEncoder(nn.Module):
    """AutoencoderKL.encode up to the moments: forward(x [n, 3, H, W] in [-1, 1]) =
    quant_conv(encoder(x)) -> [n, 2 * embed_dim, H/f, W/f]: channels [0, embed_dim) the
    posterior's mean, the rest its log-variance as computed (the reference clamps it to
    [-30, 20] before sampling). Takes VAEDecoder's arguments; the picture has out_ch
    channels (an autoencoder's input and output are alike: 3 for every SD VAE)."""

    def __init__(self, embed_dim: int = 4, ch: int = 128, out_ch: int = 3, ch_mult=(1, 2, 4, 4),
                 num_res_blocks: int = 2, attn_resolutions=(), resolution: int = 256, z_channels: int = 4):
        super().__init__()
        self.encoder = Encoder(ch, out_ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels)
        self.quant_conv = Conv2d(2 * z_channels, 2 * embed_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_conv(self.encoder(x))
