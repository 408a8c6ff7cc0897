#!/usr/bin/python3
"""The blocked route (issue 34) against the reference, alternating in one process.

Loads an exported model's UNet and VAE decoder with the CLI's operators
(build/libsd_engine.so) and times forward passes with the ResNet blocks on the
blocked route (sd_blocked::*, their weights packed as the CLI packs them at load)
and on the reference route (the modules' own code, 3x3 convolutions prepacked in
oneDNN's layout as the CLI's default `--prepack on` did before), one after the
other, each with the fused attention. Both routes share the module; the
switch swaps each convolution's weight between its two packed forms.

    OMP_WAIT_POLICY=passive bench/bench_blocked.py --model SD15 \\
        --unet-sizes 256 512 --vae-sizes 512 --repeats 3

Prints one Markdown row per timed pass (wall and CPU seconds, load average before it)
and each pair's ratio; the first two passes of each route are TorchScript's
profiling runs and are not timed.
"""

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def load_engine(path):
    if not os.path.exists(path):
        sys.exit(f"bench_blocked: {path} not found (build the sd_engine target)")
    torch.ops.load_library(path)


class Switch:
    """Both weight forms of every module the CLI can put on the blocked route."""

    def __init__(self, module, block):
        self.module = module
        self.block = block
        self.entries = []  # (block module, [(conv, reference weight, blocked weight)])
        for _, mod in module.named_modules():
            if not hasattr(mod, "blocked"):
                continue
            convs = [m for _, m in mod.named_modules() if hasattr(m, "conv_split") and hasattr(m, "weight")]
            if not convs or any(c.weight.shape[0] < block or c.weight.shape[1] < block for c in convs):
                continue
            forms = [(c, reference_weight(c), torch.ops.sd_blocked.pack_weight(c.weight, block)) for c in convs]
            self.entries.append((mod, forms))
        # The convolutions outside those blocks stay prepacked as the CLI has them either way.
        inside = {id(c) for _, forms in self.entries for c, _, _ in forms}
        for _, mod in module.named_modules():
            if hasattr(mod, "conv_split") and hasattr(mod, "weight") and id(mod) not in inside:
                mod.weight = reference_weight(mod)

    def use(self, blocked):
        for mod, forms in self.entries:
            for conv, ref, blk in forms:
                conv.weight = blk if blocked else ref
            mod.blocked = self.block if blocked else 0


def reference_weight(conv):
    """The CLI's prepack_convolutions (src/engine/stage_loader.cpp): 3x3 fp32 weights
    whose channels are multiples of 16 in oneDNN's layout, the rest as they are."""
    w = conv.weight
    if w.dim() != 4 or w.is_mkldnn or w.shape[2] * w.shape[3] == 1 or w.shape[0] % 16 or w.shape[1] % 16:
        return w
    return torch._C._nn.mkldnn_reorder_conv2d_weight(w.to_mkldnn(), list(conv.padding), list(conv.stride),
                                                     list(conv.dilation), conv.groups)


def set_fused_attention(module):
    for _, mod in module.named_modules():
        if hasattr(mod, "attention_mode"):
            mod.attention_mode = 3


def timed(fn):
    load = os.getloadavg()[0]
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0, load


def compare(name, size, module, inputs, switch, repeats):
    rows = []
    with torch.inference_mode():
        outs = {}
        for blocked in (False, True):  # TorchScript's profiling runs, and each route's output
            switch.use(blocked)
            for _ in range(2):
                outs[blocked] = module(*inputs)
        diff = (outs[True] - outs[False]).abs().max().item() / max(1.0, outs[False].abs().max().item())
        print(f"{name} {size}²: blocked vs reference max |difference| / max |reference| = {diff:.2e}", flush=True)
        for r in range(repeats):
            pair = {}
            for blocked in (False, True) if r % 2 == 0 else (True, False):
                switch.use(blocked)
                _, wall, cpu, load = timed(lambda: module(*inputs))
                pair[blocked] = (wall, cpu, load)
            (rw, rc, rl), (bw, bc, bl) = pair[False], pair[True]
            row = (f"| {name} | {size}² | {r + 1} | {rw:.2f} | {bw:.2f} | {bw / rw:.3f} | {rc:.2f} | {bc:.2f} | "
                   f"{bc / rc:.3f} | {rl:.1f} / {bl:.1f} |")
            print(row, flush=True)
            rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an exported model folder (unet.pt, vae_decoder.pt)")
    p.add_argument("--engine-lib", default=os.path.join(ROOT, "build", "libsd_engine.so"))
    p.add_argument("--unet-sizes", type=int, nargs="*", default=[256])
    p.add_argument("--vae-sizes", type=int, nargs="*", default=[])
    p.add_argument("--rows", type=int, default=2, help="UNet batch (2: one guided step)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    load_engine(args.engine_lib)
    from sd_export.stages import load_stage  # after the engine: its operators, not the Python ones

    torch.set_num_threads(args.threads)
    block = torch.ops.sd_blocked.route_block()
    if block == 0:
        sys.exit("bench_blocked: this CPU has no blocked route")
    print(f"threads {args.threads}, block {block}, SD_BLOCKED_ISA={os.environ.get('SD_BLOCKED_ISA', '')}, "
          f"DNNL_MAX_CPU_ISA={os.environ.get('DNNL_MAX_CPU_ISA', '')}", flush=True)
    header = ("| stage | size | pair | reference wall s | blocked wall s | blocked / reference wall | reference CPU s "
              "| blocked CPU s | blocked / reference CPU | load before (ref / blocked) |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    if args.unet_sizes:
        unet = load_stage(os.path.join(args.model, "unet.pt"))
        set_fused_attention(unet)
        switch = Switch(unet, block)
        print(f"UNet: {len(switch.entries)} blocks switchable", flush=True)
        for size in args.unet_sizes:
            torch.manual_seed(0)
            inputs = (torch.randn(args.rows, 4, size // 8, size // 8), torch.full((args.rows,), 501, dtype=torch.long),
                      torch.randn(args.rows, 77, 768))
            rows += compare("UNet", size, unet, inputs, switch, args.repeats)
        del unet, switch
    for size in args.vae_sizes:
        vae = load_stage(os.path.join(args.model, "vae_decoder.pt"))
        set_fused_attention(vae)
        switch = Switch(vae, block)
        print(f"VAE decoder: {len(switch.entries)} blocks switchable", flush=True)
        torch.manual_seed(0)
        rows += compare("VAE decode", size, vae, (torch.randn(1, 4, size // 8, size // 8),), switch, args.repeats)
        del vae, switch
    print()
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
