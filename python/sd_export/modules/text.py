"""The text encoders: CLIP's text transformer under HF CLIPTextModel names.

* ``TextEncoder``  <- ``cond_stage_model.transformer.``  (SD 1.x; SD 2.x's OpenCLIP text
  tower is the same network, its weights are renamed by the export (keymaps), and only
  the layers SD uses are built: 23 of 24 for "penultimate"); SDXL's first encoder
  <- ``conditioner.embedders.0.transformer.``
* ``TextEncoderWithProjection`` <- SDXL's ``conditioner.embedders.1.model.`` (renamed
  like SD 2.x's)
"""

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn


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
    def forward_with_hidden(self, x: torch.Tensor, mask: torch.Tensor,
                            hidden_after: int) -> Tuple[torch.Tensor, torch.Tensor]:
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

    def from_token_embeddings_with_hidden(self, tokens: torch.Tensor,
                                          hidden_after: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(the state after `hidden_after` layers, the final LayerNorm of the state after all)."""
        x, mask = self.prepare(tokens)
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
        return self.forward_pooled_embeds(self.text_model.embeddings.token_embedding(ids), ids)

    @torch.jit.export
    def forward_pooled_embeds(self, tokens: torch.Tensor, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """forward_pooled from token embeddings (textual inversion: some rows are an
        embedding's vectors, their ids past the vocabulary); pooled at argmax(ids) as
        diffusers does, which is an added token's position when one is in the text."""
        hidden, last = self.text_model.from_token_embeddings_with_hidden(
            tokens, self.text_model.encoder.num_layers - 1 - self.clip_skip)
        rows = torch.arange(last.shape[0], device=last.device)
        pooled = last[rows, ids.argmax(dim=-1)]
        return hidden, self.text_projection(pooled)
