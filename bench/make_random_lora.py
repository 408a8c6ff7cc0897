#!/usr/bin/python3
"""A random LoRA in the kohya/A1111 format for the full-size SD 1.5 architecture,
shaped like LCM-LoRA (every attention and feed-forward layer of the UNet's
transformers, their proj_in/proj_out 1x1 convolutions, the text encoder's
attention and MLP), for bench/bench_fewstep.py's merged-at-load row, or the same
layers as LyCORIS LoHa or LoKr modules (--kind), with a DoRA magnitude per input
column if asked (--dora). The values do not matter for time and memory.

    PYTHONPATH=python /usr/bin/python3 bench/make_random_lora.py OUT.safetensors [--rank 64] [--kind lora|loha|lokr] \
        [--dora]
"""
import argparse

import torch

from sd_export.safetensors_io import write_safetensors


def targets():
    """(kohya module name, out, in, is 1x1 conv) of the SD 1.5 layers a LoRA of this shape touches."""
    blocks = [(f"down_blocks_{b}_attentions_{a}", c) for b, c in enumerate([320, 640, 1280]) for a in range(2)]
    blocks += [("mid_block_attentions_0", 1280)]
    blocks += [(f"up_blocks_{b}_attentions_{a}", c) for b, c in zip([1, 2, 3], [1280, 640, 320]) for a in range(3)]
    out = []
    for name, c in blocks:
        base = f"lora_unet_{name}"
        out += [(f"{base}_proj_in", c, c, True), (f"{base}_proj_out", c, c, True)]
        t = f"{base}_transformer_blocks_0"
        for attn, ctx in (("attn1", c), ("attn2", 768)):
            out += [(f"{t}_{attn}_to_q", c, c, False), (f"{t}_{attn}_to_k", c, ctx, False),
                    (f"{t}_{attn}_to_v", c, ctx, False), (f"{t}_{attn}_to_out_0", c, c, False)]
        out += [(f"{t}_ff_net_0_proj", 8 * c, c, False), (f"{t}_ff_net_2", c, 4 * c, False)]
    for layer in range(12):
        t = f"lora_te_text_model_encoder_layers_{layer}"
        out += [(f"{t}_self_attn_{p}_proj", 768, 768, False) for p in ("q", "k", "v", "out")]
        out += [(f"{t}_mlp_fc1", 3072, 768, False), (f"{t}_mlp_fc2", 768, 3072, False)]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--kind", choices=["lora", "loha", "lokr"], default="lora")
    p.add_argument("--dora", action="store_true", help="add a DoRA magnitude (dora_scale) per input column")
    a = p.parse_args()
    g = torch.Generator().manual_seed(0)
    tensors = {}
    def randn(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).half()

    for name, n_out, n_in, conv in targets():
        tensors[f"{name}.alpha"] = torch.tensor(float(a.rank)).half()
        if a.dora:  # [1, in] or, for a 1x1 conv, [1, in, 1, 1]
            tensors[f"{name}.dora_scale"] = (torch.rand(1, n_in, *((1, 1) if conv else ()), generator=g) + 0.5).half()
        if a.kind == "loha":  # two rank-r factors multiplied elementwise (2D: fills a 1x1 conv too)
            for f in ("1", "2"):
                tensors[f"{name}.hada_w{f}_a"] = randn(n_out, a.rank)
                tensors[f"{name}.hada_w{f}_b"] = randn(a.rank, n_in)
            continue
        if a.kind == "lokr":  # kron of a whole 8x8 w1 and a rank-r w2
            tensors[f"{name}.lokr_w1"] = randn(8, 8)
            tensors[f"{name}.lokr_w2_a"] = randn(n_out // 8, a.rank)
            tensors[f"{name}.lokr_w2_b"] = randn(a.rank, n_in // 8)
            continue
        down = torch.randn(a.rank, n_in, generator=g) / n_in ** 0.5
        up = torch.randn(n_out, a.rank, generator=g) * 0.01
        if conv:
            down, up = down[:, :, None, None], up[:, :, None, None]
        tensors[f"{name}.lora_down.weight"] = down.half()
        tensors[f"{name}.lora_up.weight"] = up.half()
    write_safetensors(a.out, sorted(tensors.items()), metadata={"ss_network_dim": str(a.rank)})
    print(f"{a.out}: {len(tensors)} tensors, {a.kind}, rank {a.rank}")


if __name__ == "__main__":
    main()
