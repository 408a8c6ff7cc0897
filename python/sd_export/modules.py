"""TorchScript-ready modules of Stable Diffusion 1.x, 2.x and SDXL (CompVis / Stability-AI layouts).

Exportable modules, each with the state-dict names of the CompVis checkpoints
below its prefix so that weights load by name (SDXL: sgm's single-file names):

* ``TextEncoder``  <- ``cond_stage_model.transformer.``  (HF CLIPTextModel names; SD 2.x's
  OpenCLIP text tower is the same network, its weights are renamed by the export (keymaps),
  and only the layers SD uses are built: 23 of 24 for "penultimate")
* ``TextEncoderWithProjection`` <- SDXL's ``conditioner.embedders.1.model.`` (renamed
  like SD 2.x's; SDXL's first encoder is a ``TextEncoder`` <- ``conditioner.embedders.0.transformer.``)
* ``UNetModel``    <- ``model.diffusion_model.``
* ``VAEDecoder``   <- ``first_stage_model.``  (post_quant_conv + decoder; no encoder)

The arithmetic follows the reference implementation operation by operation (same
op order, same eps values, fp32 GroupNorm in the UNet), so an fp32 run agrees with
the reference to float rounding.  Everything is written for ``torch.jit.script``:
one export serves every batch size and image size.

Attention (UNet ``CrossAttention`` and VAE ``AttnBlock``) reads two int attributes
at run time, set from C++ with ``setattr`` (see docs/model-format.md):
``attention_mode`` 0 = all heads in one batched matmul (the reference),
1 = one head at a time (default; bit-identical to 0, far less memory),
2 = one head at a time in chunks of ``attention_chunk`` query rows,
3 = fused: the ``sd::attention`` operator (sd_export/ops.py), which the C++
program implements with a kernel that never holds more than a tile of scores.
"""

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import ops  # noqa: F401 - defines torch.ops.sd.attention and .linear for torch.jit.script

# attention_mode values (TorchScript cannot read module globals, so forward() uses the literals).
ATTN_ALL_HEADS = 0
ATTN_PER_HEAD = 1
ATTN_CHUNKED = 2
ATTN_FUSED = 3
DEFAULT_ATTENTION_MODE = ATTN_PER_HEAD
DEFAULT_ATTENTION_CHUNK = 256


# --------------------------------------------------------------------------- text

class CLIPEmbeddings(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(ctx, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        return self.token_embedding(ids) + self.position_embedding.weight[:length].unsqueeze(0)


class CLIPAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.scale = self.head_dim ** -0.5
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, self.head_dim).permute(0, 2, 1, 3).reshape(b * self.heads, n, self.head_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, width = x.shape
        q = self._split(self.q_proj(x) * self.scale)
        k = self._split(self.k_proj(x))
        v = self._split(self.v_proj(x))
        w = torch.softmax(torch.bmm(q, k.transpose(1, 2)) + mask, dim=-1)
        out = torch.bmm(w, v)
        out = out.reshape(b, self.heads, n, self.head_dim).permute(0, 2, 1, 3).reshape(b, n, width)
        return self.out_proj(out)


class CLIPMLP(nn.Module):
    def __init__(self, width: int, hidden: int, quick_gelu: bool):
        super().__init__()
        self.quick_gelu = quick_gelu
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.quick_gelu:
            x = x * torch.sigmoid(1.702 * x)
        else:
            x = F.gelu(x)
        return self.fc2(x)


class CLIPEncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int, quick_gelu: bool, eps: float):
        super().__init__()
        self.self_attn = CLIPAttention(width, heads)
        self.layer_norm1 = nn.LayerNorm(width, eps=eps)
        self.mlp = CLIPMLP(width, hidden, quick_gelu)
        self.layer_norm2 = nn.LayerNorm(width, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, hidden: int, quick_gelu: bool, eps: float):
        super().__init__()
        self.layers = nn.ModuleList(
            [CLIPEncoderLayer(width, heads, hidden, quick_gelu, eps) for _ in range(layers)])
        self.num_layers = layers

    def forward(self, x: torch.Tensor, mask: torch.Tensor, skip: int) -> torch.Tensor:
        # Clip skip: the last `skip` layers do not run (skip = number of layers: the embeddings alone).
        used = self.num_layers - skip
        i = 0
        for layer in self.layers:
            if i < used:
                x = layer(x, mask)
            i += 1
        return x

    @torch.jit.export
    def forward_with_hidden(self, x: torch.Tensor, mask: torch.Tensor, hidden_after: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(the state after `hidden_after` layers, the state after all of them)."""
        hidden = x
        i = 0
        for layer in self.layers:
            if i == hidden_after:
                hidden = x
            x = layer(x, mask)
            i += 1
        if hidden_after >= self.num_layers:
            hidden = x
        return hidden, x


class CLIPTextTransformer(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int, hidden: int,
                 quick_gelu: bool, eps: float):
        super().__init__()
        self.embeddings = CLIPEmbeddings(vocab, ctx, width)
        self.encoder = CLIPEncoder(layers, width, heads, hidden, quick_gelu, eps)
        self.final_layer_norm = nn.LayerNorm(width, eps=eps)
        # SDXL's CLIP-L output is a hidden state without the final LayerNorm.
        self.final_norm: bool = True

    def forward(self, ids: torch.Tensor, skip: int) -> torch.Tensor:
        return self.from_token_embeddings(self.embeddings.token_embedding(ids), skip)

    def prepare(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Token embeddings plus positions, and the causal mask (position i sees positions <= i)."""
        length = tokens.shape[1]
        x = tokens + self.embeddings.position_embedding.weight[:length].unsqueeze(0)
        mask = torch.full((length, length), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        return x, mask

    def from_token_embeddings(self, tokens: torch.Tensor, skip: int) -> torch.Tensor:
        x, mask = self.prepare(tokens)
        x = self.encoder(x, mask, skip)
        # The final LayerNorm runs whatever the skip (as diffusers' and A1111's clip skip).
        if self.final_norm:
            x = self.final_layer_norm(x)
        return x

    def forward_with_hidden(self, ids: torch.Tensor, hidden_after: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(the state after `hidden_after` layers, the final LayerNorm of the state after all)."""
        x, mask = self.prepare(self.embeddings.token_embedding(ids))
        hidden, last = self.encoder.forward_with_hidden(x, mask, hidden_after)
        return hidden, self.final_layer_norm(last)


class TextEncoder(nn.Module):
    """CLIP text transformer; forward(ids [n, L] int64) -> last_hidden_state [n, L, width].

    ``clip_skip`` (int attribute, set from C++ like ``attention_mode``): how many of the
    last layers do not run (0 = all run); the final LayerNorm is applied either way.
    ``forward_embeds(tokens [n, L, width])`` takes the token embeddings instead of ids
    (textual inversion: some rows are vectors of an embedding file); positions, layers
    and the final LayerNorm then run as in ``forward``.
    """

    def __init__(self, vocab: int = 49408, ctx: int = 77, width: int = 768, layers: int = 12,
                 heads: int = 12, hidden: int = 3072, quick_gelu: bool = True, eps: float = 1e-5):
        super().__init__()
        self.text_model = CLIPTextTransformer(vocab, ctx, width, layers, heads, hidden, quick_gelu, eps)
        self.clip_skip: int = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_model(ids, self.clip_skip)

    @torch.jit.export
    def forward_embeds(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.text_model.from_token_embeddings(tokens, self.clip_skip)


class TextEncoderWithProjection(nn.Module):
    """SDXL's second text encoder, OpenCLIP ViT-bigG's text tower under HF
    CLIPTextModelWithProjection names (diffusers' text_encoder_2; the single file's
    open_clip names are mapped by the export).

    ``forward(ids) -> [n, L, width]``: the penultimate state (the input of the last
    layer), without the final LayerNorm. ``forward_pooled(ids) -> (that, [n, proj])``:
    also the pooled vector, the final LayerNorm of the last layer's output at the
    end-of-text token (the largest id, as open_clip finds it) times ``text_projection``.
    ``clip_skip`` moves the penultimate state back by that many layers; the pooled
    vector always comes from all of them.
    """

    def __init__(self, vocab: int = 49408, ctx: int = 77, width: int = 1280, layers: int = 32,
                 heads: int = 20, hidden: int = 5120, quick_gelu: bool = False, eps: float = 1e-5,
                 projection: int = 1280):
        super().__init__()
        self.text_model = CLIPTextTransformer(vocab, ctx, width, layers, heads, hidden, quick_gelu, eps)
        self.text_projection = nn.Linear(width, projection, bias=False)
        self.clip_skip: int = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.forward_pooled(ids)[0]

    @torch.jit.export
    def forward_pooled(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        hidden, last = self.text_model.forward_with_hidden(ids, self.text_model.encoder.num_layers - 1 - self.clip_skip)
        rows = torch.arange(last.shape[0], device=last.device)
        pooled = last[rows, ids.argmax(dim=-1)]
        return hidden, self.text_projection(pooled)


# --------------------------------------------------------------------------- layers
# The UNet and the VAE decoder are built from these instead of the torch.nn ones.
# Their weights may be held in another dtype than they compute in (fp16 weights
# with fp32 compute on a CPU, `--weights fp16`): each layer casts its weights to
# the input's dtype as it runs, so only one layer's fp32 copy exists at a time.
# With matching dtypes `.to` returns the tensor itself: no copy, same results.


def _cast(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    if t is None:
        return None
    return t.to(dtype)


class Linear(nn.Linear):
    """F.linear through sd::linear (sd_export/ops.py): the C++ program runs it
    with oneDNN instead of LibTorch's OpenBLAS path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.sd.linear(x, self.weight.to(x.dtype), _cast(self.bias, x.dtype))


class Conv2d(nn.Conv2d):
    """A Conv2d that can also run in slices of output channels: `conv_split`
    (bytes, set from C++ like the attention attributes; 0 = whole) caps the
    weight bytes of one call, since oneDNN copies a conv's whole weight into
    its own layout on every call and the largest SD 1.x weight is 118 MB.
    The C++ program may instead replace the weight, once at load, by oneDNN's
    own layout (an mkldnn tensor, src/engine/stage_loader.cpp "prepack"): the
    layer then convolves with it directly and nothing is copied per call."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.conv_split: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.is_mkldnn:  # prepacked (fp32 on the CPU only)
            return torch.mkldnn_convolution(x.to_mkldnn(), w, self.bias, self.padding, self.stride, self.dilation,
                                            self.groups).to_dense()
        out_ch = w.shape[0]
        per_call = out_ch
        if self.conv_split > 0:
            per_call = max(1, self.conv_split // (w[0].numel() * 4))
        if per_call >= out_ch:
            return self._conv_forward(x, w.to(x.dtype), _cast(self.bias, x.dtype))
        parts: List[torch.Tensor] = []
        for start in range(0, out_ch, per_call):
            b = self.bias
            if b is not None:
                b = b[start:start + per_call].to(x.dtype)
            parts.append(self._conv_forward(x, w[start:start + per_call].to(x.dtype), b))
        return torch.cat(parts, 1)


# The norms compute in fp32 whatever the input dtype (half or bf16 compute on a
# GPU, as autocast does); for fp32 input `.float()` is the tensor itself.
class GroupNorm(nn.GroupNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x.float(), self.num_groups, _cast(self.weight, torch.float32),
                            _cast(self.bias, torch.float32), self.eps).to(x.dtype)


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.normalized_shape, _cast(self.weight, torch.float32),
                            _cast(self.bias, torch.float32), self.eps).to(x.dtype)


# --------------------------------------------------------------------------- UNet

class GroupNorm32(nn.GroupNorm):
    """The UNet's GroupNorm: computed in fp32 whatever the input dtype (as the reference)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
    def __init__(self, channels: int, emb_channels: int, out_channels: int):
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

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x)
        emb_out = self.emb_layers(emb).to(h.dtype)
        h = h + emb_out[:, :, None, None]
        h = self.out_layers(h)
        return self.skip_connection(x) + h


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.op = Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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

        self.input_blocks = nn.ModuleList(
            [TimestepEmbedSequential(EmbConv2d(in_channels, model_channels, 3, padding=1))])
        skip_channels = [model_channels]
        ch = model_channels
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers: List[nn.Module] = [ResBlock(ch, emb_dim, mult * model_channels)]
                ch = mult * model_channels
                if ds in attention_resolutions:
                    layers.append(transformer(ch, depths[level]))
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                skip_channels.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(Downsample(ch)))
                skip_channels.append(ch)
                ds *= 2

        self.middle_block = TimestepEmbedSequential(
            ResBlock(ch, emb_dim, ch), transformer(ch, depths[-1]), ResBlock(ch, emb_dim, ch))

        self.output_blocks = nn.ModuleList([])
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                skip = skip_channels.pop()
                layers = [ResBlock(ch + skip, emb_dim, model_channels * mult)]
                ch = model_channels * mult
                if ds in attention_resolutions:
                    layers.append(transformer(ch, depths[level]))
                if level and i == num_res_blocks:
                    layers.append(Upsample(ch))
                    ds //= 2
                self.output_blocks.append(TimestepEmbedSequential(*layers))

        self.out = nn.Sequential(unet_norm(ch), nn.SiLU(), Conv2d(model_channels, out_channels, 3, padding=1))

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
            h = torch.cat([h, hs.pop()], dim=1)
            h = block(h, emb, context)
        return self.out(h.to(x.dtype))


# --------------------------------------------------------------------------- VAE decoder

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


# --------------------------------------------------------------------------- TorchScript names

# TorchScript names each class and function after its __module__: exports name them
# __torch__.sd_modules.* (this file was models/sd_modules.py), and model folders already
# written, and the CLI's list of accepted names (src/io/op_allowlist.inc), carry that name.
# So they keep it; TorchScript then reads a class's source through sys.modules["sd_modules"].
TORCHSCRIPT_MODULE = "sd_modules"


def _keep_torchscript_names():
    import inspect
    import sys
    for value in list(globals().values()):
        if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == __name__:
            value.__module__ = TORCHSCRIPT_MODULE
    sys.modules.setdefault(TORCHSCRIPT_MODULE, sys.modules[__name__])


_keep_torchscript_names()
