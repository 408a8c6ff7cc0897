#!/usr/bin/python3
"""One fused attention call (the CLI's `sd::attention`) at SD 1.5's 512² self-attention shapes.

Times `[2, 4096, 320]` (8 heads of 40) and `[2, 1024, 640]` (8 heads of 80), q, k and v alike,
in fp32 and bf16, best of --repeats calls, 2 threads, and prints GFLOP/s counting both
products (q·kᵀ and w·v, 2 FLOP a multiply-add). Compare two builds by running it with each
library in turn, several times, and taking each one's best: this machine's speed swings more
from minute to minute than most changes do.

    OMP_WAIT_POLICY=passive /usr/bin/python3 bench/bench_attention.py [--library build/libsd_engine.so]
"""
import argparse
import os
import time

import torch


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", default=os.path.join(here, "build", "libsd_engine.so"))
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.ops.load_library(args.library)
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}, {args.threads} thread(s), {args.library}")
    for dtype in (torch.bfloat16, torch.float32):
        for n, c, heads in ((4096, 320, 8), (1024, 640, 8)):
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(2, n, c, generator=g).to(dtype) for _ in range(3))
            scale = (c // heads) ** -0.5
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                torch.ops.sd.attention(q, k, v, heads, scale)
                best = min(best, time.perf_counter() - start)
            flop = 2 * 2 * 2 * n * n * c
            print(f"{str(dtype).split('.')[-1]:9} [2, {n}, {c}] {heads} heads: {best * 1e3:7.1f} ms, "
                  f"{flop / best / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
