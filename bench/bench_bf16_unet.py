#!/usr/bin/python3
"""One guided UNet step (2 rows) in fp32 and in bf16, alternating in one process (issue 34).

Loads an exported UNet twice, as the CLI holds it for `--precision fp32` and
`--precision bf16` (weights narrowed to bf16; 3x3 convolutions prepacked for
oneDNN; fused attention), with the CLI's own operators (build/libsd_engine.so),
then times forwards alternating fp32 and bf16: wall and CPU seconds and the
load average beside each. TorchScript runs the graphs as written, as the CLI
sets it; one warm-up call each comes first and is not counted.

    OMP_WAIT_POLICY=passive /usr/bin/python3 bench/bench_bf16_unet.py --model SD15 \\
        --sizes 512 --repeats 3 [--profile 256]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import torch  # noqa: E402

from bench_speed import ENGINE_LIB, load_stage, prepack, set_attention, set_threads  # noqa: E402


def load_unet(model, dtype):
    unet = load_stage(os.path.join(model, "unet.pt")).to(dtype)
    set_attention(unet, "fused")
    prepack(unet)
    return unet


def inputs(size, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    h = size // 8
    return (torch.randn(2, 4, h, h, generator=g).to(dtype), torch.full((2,), 501, dtype=torch.long),
            torch.randn(2, 77, 768, generator=g).to(dtype))


def timed(module, args):
    w0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = module(*args)
    return out, time.perf_counter() - w0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an exported model directory (unet.pt)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[256])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["fp32", "bf16"], help="time one precision only")
    ap.add_argument("--profile", type=int, default=0, help="also profile one bf16 forward at this size")
    ap.add_argument("--engine-lib", help="(read by bench_speed) the engine library with the CLI's operators")
    args = ap.parse_args()
    if not ENGINE_LIB:
        sys.exit("bench_bf16_unet: build/libsd_engine.so not found (cmake --build build --target sd_engine)")
    set_threads(args.threads)
    # As the CLI (src/engine/runtime.cpp): the graphs run as written, with no
    # re-optimisation on the second call.
    torch._C._set_graph_executor_optimize(False)
    kinds = [args.only] if args.only else ["fp32", "bf16"]
    units = {k: load_unet(args.model, torch.float32 if k == "fp32" else torch.bfloat16) for k in kinds}
    print(f"engine library: {ENGINE_LIB}; threads {args.threads}; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; DNNL_MAX_CPU_ISA={os.environ.get('DNNL_MAX_CPU_ISA', '(unset)')}")
    print("| size | repeat | fp32 wall s | bf16 wall s | bf16 / fp32 wall | fp32 CPU s | bf16 CPU s | bf16 / fp32 CPU "
          "| load (1 min) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in args.sizes:
        ins = {k: inputs(size, torch.float32 if k == "fp32" else torch.bfloat16) for k in kinds}
        outs = {}
        for k in kinds:  # warm-up (oneDNN's kernels, the allocator's first blocks), not counted
            outs[k], _, _ = timed(units[k], ins[k])
        if len(kinds) == 2:
            a, b = outs["fp32"], outs["bf16"].float()
            print(f"<!-- {size}²: bf16 output relative RMS from fp32: {((a - b).norm() / a.norm()).item():.4f} -->")
        for r in range(args.repeats):
            t = {}
            for k in kinds:
                _, wall, cpu = timed(units[k], ins[k])
                t[k] = (wall, cpu, os.getloadavg()[0])
            f = t.get("fp32", (float("nan"),) * 3)
            g = t.get("bf16", (float("nan"),) * 3)
            print(f"| {size}² | {r + 1} | {f[0]:.2f} | {g[0]:.2f} | {g[0] / f[0]:.3f} | {f[1]:.2f} | {g[1]:.2f} | "
                  f"{g[1] / f[1]:.3f} | {f[2]:.1f}, {g[2]:.1f} |", flush=True)
    if args.profile and "bf16" in units:
        ins = inputs(args.profile, torch.bfloat16)
        with torch.inference_mode():
            units["bf16"](*ins)
            with torch.autograd.profiler.profile() as prof:
                units["bf16"](*ins)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) or 1.0
        print(f"\nbf16 {args.profile}² forward, self CPU time by op ({total / 1e6:.2f} s in all):")
        for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:14]:
            print(f"  {e.key:40s} {e.count:6d} calls {e.self_cpu_time_total / 1e6:7.3f} s "
                  f"{100 * e.self_cpu_time_total / total:5.1f}%")


if __name__ == "__main__":
    main()
