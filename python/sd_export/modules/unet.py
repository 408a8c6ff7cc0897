"""The UNet: ``UNetModel`` <- ``model.diffusion_model.`` (openaimodel.UNetModel with the
spatial transformer: SD 1.x, SD 2.x's linear projections, SDXL's per-level depths and
vector input), built from the layers of layers.py."""

import math
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .layers import (DEFAULT_ATTENTION_CHUNK, DEFAULT_ATTENTION_MODE, Conv2d, GroupNorm, LayerNorm, Linear, _cast,
                     _expand, plain_layout)


class GroupNorm32(nn.GroupNorm):
    """The UNet's GroupNorm: computed in fp32 whatever the input dtype (as the reference)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16:  # one pass in C++ (layers.GroupNorm)
            return torch.ops.sd.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return F.group_norm(x.float(), self.num_groups, _cast(self.weight, torch.float32),
                            _cast(self.bias, torch.float32), self.eps).to(x.dtype)


def unet_norm(channels: int) -> GroupNorm32:
    return GroupNorm32(32, channels, eps=1e-5)


def transformer_norm(channels: int) -> GroupNorm:
    return GroupNorm(32, channels, eps=1e-6, affine=True)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2 == 1:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


# Every layer inside a UNet block takes (x, emb, context), so a block is a plain loop.

class EmbConv2d(Conv2d):
    """A Conv2d usable inside a UNet block (input_blocks.0.0)."""

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight.to(x.dtype), _cast(self.bias, x.dtype))


class TimestepEmbedSequential(nn.Sequential):
    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = layer(x, emb, context)
        return x


class ResBlock(nn.Module):
    """plain_out: a layer that needs a plain tensor (a transformer) follows, so the
    blocked route gives its result plain (layers.py plain_layout)."""

    def __init__(self, channels: int, emb_channels: int, out_channels: int, plain_out: bool = False):
        super().__init__()
        # nn.Identity stands where the reference has Dropout, keeping the checkpoint's indices.
        self.in_layers = nn.Sequential(unet_norm(channels), nn.SiLU(), Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(unet_norm(out_channels), nn.SiLU(), nn.Identity(),
                                        Conv2d(out_channels, out_channels, 3, padding=1))
        if out_channels == channels:
            self.skip_connection = nn.Identity()
        else:
            self.skip_connection = Conv2d(channels, out_channels, 1)
        self.channels = channels
        self.out_channels = out_channels
        self.blocked: int = 0  # layers.py: the blocked route, set from C++
        self.plain_out = plain_out

    def _blocked_forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        skip_w: Optional[torch.Tensor] = None
        skip_b: Optional[torch.Tensor] = None
        if hasattr(self.skip_connection, "weight"):
            skip_w = self.skip_connection.weight
            skip_b = self.skip_connection.bias
        norm1 = self.in_layers[0]
        norm2 = self.out_layers[0]
        return torch.ops.sd_blocked.resblock(
            x, self.emb_layers(emb), norm1.weight, norm1.bias, norm1.eps, self.in_layers[2].weight,
            self.in_layers[2].bias, norm2.weight, norm2.bias, norm2.eps, self.out_layers[3].weight,
            self.out_layers[3].bias, skip_w, skip_b, norm1.num_groups, self.channels, self.out_channels, self.blocked,
            self.plain_out)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if self.blocked > 0:
            return self._blocked_forward(x, emb)
        x = plain_layout(x)
        h = self.in_layers(x)
        emb_out = self.emb_layers(emb).to(h.dtype)
        h = h + emb_out[:, :, None, None]
        h = self.out_layers(h)
        return self.skip_connection(x) + h


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.op = Conv2d(channels, channels, 3, stride=2, padding=1)
        self.channels = channels
        self.blocked: int = 0  # layers.py: the blocked route, set from C++

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if self.blocked > 0:
            return torch.ops.sd_blocked.downsample(x, self.op.weight, self.op.bias, self.channels, 1, 1, self.blocked,
                                                   False)
        return self.op(plain_layout(x))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = Conv2d(channels, channels, 3, padding=1)
        self.channels = channels
        self.blocked: int = 0  # layers.py: the blocked route, set from C++

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if self.blocked > 0:
            return torch.ops.sd_blocked.upsample(x, self.conv.weight, self.conv.bias, self.channels, self.blocked,
                                                 False)
        return self.conv(F.interpolate(plain_layout(x), scale_factor=2.0, mode="nearest"))


class CrossAttention(nn.Module):
    def __init__(self, query_dim: int, context_dim: int, heads: int, dim_head: int):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.dim_head = dim_head
        self.scale = dim_head ** -0.5
        self.to_q = Linear(query_dim, inner, bias=False)
        self.to_k = Linear(context_dim, inner, bias=False)
        self.to_v = Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(Linear(inner, query_dim), nn.Identity())
        # Plain attributes (not constants) so C++ can change them after loading.
        self.attention_mode: int = DEFAULT_ATTENTION_MODE
        self.attention_chunk: int = DEFAULT_ATTENTION_CHUNK

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [B, n, d], k and v [B, m, d] -> [B, n, d]; the reference's two einsums.
        # Scores and softmax in fp32 under half compute: fp16 scores overflow (black
        # SD 2.x images). With fp32 input both casts return the tensor itself.
        sim = torch.bmm(q.float(), k.float().transpose(1, 2)) * self.scale
        return torch.bmm(sim.softmax(dim=-1).to(v.dtype), v)

    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None) -> torch.Tensor:
        if context is None:
            context = x
        q = self.to_q(x)
        k = self.to_k(context)
        v = self.to_v(context)
        b, n, _ = q.shape
        m = k.shape[1]
        h = self.heads
        d = self.dim_head
        if self.attention_mode == 3:  # fused operator
            return self.to_out(torch.ops.sd.attention(q, k, v, h, self.scale))
        if self.attention_mode == 0:  # all heads at once
            q = q.reshape(b, n, h, d).permute(0, 2, 1, 3).reshape(b * h, n, d)
            k = k.reshape(b, m, h, d).permute(0, 2, 1, 3).reshape(b * h, m, d)
            v = v.reshape(b, m, h, d).permute(0, 2, 1, 3).reshape(b * h, m, d)
            out = self._attend(q, k, v)
            out = out.reshape(b, h, n, d).permute(0, 2, 1, 3).reshape(b, n, h * d)
        else:
            # Per head: the [b, n, m] score matrix of one head is the peak instead of all heads'.
            chunk = n
            if self.attention_mode == 2 and self.attention_chunk > 0:  # chunked
                chunk = self.attention_chunk
            out = torch.empty((b, n, h, d), dtype=q.dtype, device=q.device)
            for i in range(h):
                # Contiguous per-head copies give every matmul the layout of the all-heads path.
                qh = q[:, :, i * d:(i + 1) * d].contiguous()
                kh = k[:, :, i * d:(i + 1) * d].contiguous()
                vh = v[:, :, i * d:(i + 1) * d].contiguous()
                for start in range(0, n, chunk):
                    out[:, start:start + chunk, i] = self._attend(qh[:, start:start + chunk], kh, vh)
            out = out.reshape(b, n, h * d)
        return self.to_out(out)


class GEGLU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = Linear(dim_in, dim_out * 2)
        # 1: fp32 takes the one-pass gate too, set from C++ with the prepacked
        # route (src/engine/stage_loader.h use_fused_rows); 0 keeps the reference.
        self.fused_rows: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16 or self.fused_rows > 0:
            # One pass in C++ (ops.py) that also adds the projection's bias: LibTorch's
            # gelu on the strided half of a chunk runs 10-20x slower than on a dense
            # tensor, bf16 adds two copies, and a Linear's bias is one more pass.
            p = self.proj
            h = torch.ops.sd.linear(x, _expand(p.weight, p.weight_scale, x.dtype), None)
            return torch.ops.sd.geglu(h, p.bias)
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        inner = dim * mult
        self.net = nn.Sequential(GEGLU(dim, inner), nn.Identity(), Linear(inner, dim))
        # Tokens per call (0 = all): GEGLU's [tokens, 8 x dim] temporaries are the
        # largest of a transformer block at 64x64 latents (~100 MB a row).
        self.ff_chunk: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        if self.ff_chunk <= 0 or self.ff_chunk >= n:
            return self.net(x)
        out = torch.empty((x.shape[0], n, x.shape[2]), dtype=x.dtype, device=x.device)
        for start in range(0, n, self.ff_chunk):
            out[:, start:start + self.ff_chunk] = self.net(x[:, start:start + self.ff_chunk])
        return out


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, context_dim: int):
        super().__init__()
        self.attn1 = CrossAttention(dim, dim, heads, dim_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(dim, context_dim, heads, dim_head)
        self.norm1 = LayerNorm(dim)
        self.norm2 = LayerNorm(dim)
        self.norm3 = LayerNorm(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class SpatialTransformer(nn.Module):
    """SD 1.x projects in and out with 1x1 convolutions on the image layout; SD 2.x
    (use_linear) with Linear layers on the token layout."""

    def __init__(self, channels: int, heads: int, dim_head: int, depth: int, context_dim: int,
                 use_linear: bool = False):
        super().__init__()
        inner = heads * dim_head
        self.use_linear = use_linear
        self.inner = inner
        self.norm = transformer_norm(channels)
        if use_linear:
            self.proj_in = Linear(channels, inner)
            self.proj_out = Linear(inner, channels)
        else:
            self.proj_in = Conv2d(channels, inner, 1)
            self.proj_out = Conv2d(inner, channels, 1)
        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlock(inner, heads, dim_head, context_dim) for _ in range(depth)])

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, channels, hh, ww = x.shape
        x_in = x
        x = self.norm(x)
        if self.use_linear:
            x = x.permute(0, 2, 3, 1).reshape(b, hh * ww, channels)
            x = self.proj_in(x)
        else:
            x = self.proj_in(x)
            x = x.permute(0, 2, 3, 1).reshape(b, hh * ww, self.inner)
        for block in self.transformer_blocks:
            x = block(x, context)
        if self.use_linear:
            x = self.proj_out(x)
            return x.reshape(b, hh, ww, channels).permute(0, 3, 1, 2).contiguous() + x_in
        # The reference leaves a channels-last view here, which makes every following
        # conv copy its weights on each call; a contiguous tensor avoids that.
        x = x.reshape(b, hh, ww, self.inner).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(x) + x_in


def attention_heads(ch: int, num_heads: int, num_head_channels: int):
    """(heads, dim_head) for a transformer at `ch` channels, as openaimodel.UNetModel."""
    if num_head_channels == -1:
        return num_heads, ch // num_heads
    return ch // num_head_channels, num_head_channels


class UNetModel(nn.Module):
    """openaimodel.UNetModel with use_spatial_transformer (SD 1.x; SD 2.x with
    use_linear_in_transformer; SDXL with per-level depths and the vector input
    adm_in_channels); forward(x, t, context[, y]) -> eps (or v)."""

    def __init__(self, in_channels: int = 4, out_channels: int = 4, model_channels: int = 320,
                 attention_resolutions=(4, 2, 1), num_res_blocks: int = 2, channel_mult=(1, 2, 4, 4),
                 num_heads: int = 8, num_head_channels: int = -1, transformer_depth=1,
                 context_dim: int = 768, use_linear_in_transformer: bool = False, adm_in_channels: int = 0):
        super().__init__()
        self.model_channels = model_channels
        emb_dim = model_channels * 4
        self.time_embed = nn.Sequential(Linear(model_channels, emb_dim), nn.SiLU(), Linear(emb_dim, emb_dim))
        # SDXL: the vector input y (pooled text and size embeddings) is added to the time embedding.
        self.adm_in_channels = adm_in_channels
        if adm_in_channels > 0:
            self.label_emb = nn.Sequential(
                nn.Sequential(Linear(adm_in_channels, emb_dim), nn.SiLU(), Linear(emb_dim, emb_dim)))
        else:
            self.label_emb = nn.Identity()
        # One depth for every level (SD 1.x/2.x) or one per level (SDXL; the middle block takes the last).
        depths = list(transformer_depth) if isinstance(transformer_depth, (list, tuple)) \
            else [transformer_depth] * len(channel_mult)

        def transformer(ch: int, depth: int) -> SpatialTransformer:
            heads, dim_head = attention_heads(ch, num_heads, num_head_channels)
            return SpatialTransformer(ch, heads, dim_head, depth, context_dim, use_linear_in_transformer)

        def at_div(block: nn.Module, div: int) -> nn.Module:
            """Marks the convolutions inside not yet marked as running at latent size / div."""
            for m in block.modules():
                if isinstance(m, Conv2d) and m.latent_div == 0:
                    m.latent_div = div
            return block

        self.input_blocks = nn.ModuleList(
            [at_div(TimestepEmbedSequential(EmbConv2d(in_channels, model_channels, 3, padding=1)), 1)])
        skip_channels = [model_channels]
        ch = model_channels
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers: List[nn.Module] = [ResBlock(ch, emb_dim, mult * model_channels, ds in attention_resolutions)]
                ch = mult * model_channels
                if ds in attention_resolutions:
                    layers.append(transformer(ch, depths[level]))
                self.input_blocks.append(at_div(TimestepEmbedSequential(*layers), ds))
                skip_channels.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(at_div(TimestepEmbedSequential(Downsample(ch)), ds))
                skip_channels.append(ch)
                ds *= 2

        self.middle_block = at_div(TimestepEmbedSequential(
            ResBlock(ch, emb_dim, ch, True), transformer(ch, depths[-1]), ResBlock(ch, emb_dim, ch)), ds)

        self.output_blocks = nn.ModuleList([])
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                skip = skip_channels.pop()
                layers = [ResBlock(ch + skip, emb_dim, model_channels * mult, ds in attention_resolutions)]
                ch = model_channels * mult
                if ds in attention_resolutions:
                    layers.append(transformer(ch, depths[level]))
                block_div = ds
                if level and i == num_res_blocks:
                    layers.append(at_div(Upsample(ch), ds // 2))  # its conv runs on the upsampled input
                    ds //= 2
                self.output_blocks.append(at_div(TimestepEmbedSequential(*layers), block_div))

        self.out = at_div(nn.Sequential(unet_norm(ch), nn.SiLU(), Conv2d(model_channels, out_channels, 3, padding=1)), 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                y: Optional[torch.Tensor] = None) -> torch.Tensor:
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        emb = self.time_embed(timestep_embedding(t, self.model_channels))
        if self.adm_in_channels > 0:
            if y is None:
                raise RuntimeError("this UNet needs its vector input y (SDXL: pooled text and size embeddings)")
            emb = emb + self.label_emb(y)
        hs: List[torch.Tensor] = []
        h = x
        for block in self.input_blocks:
            h = block(h, emb, context)
            hs.append(h)
        h = self.middle_block(h, emb, context)
        for block in self.output_blocks:
            skip = hs.pop()
            if h.dim() != skip.dim():  # one blocked, one plain (layers.py plain_layout)
                h = plain_layout(h)
                skip = plain_layout(skip)
            h = torch.cat([h, skip], dim=1)
            h = block(h, emb, context)
        return self.out(plain_layout(h).to(x.dtype))
