#!/usr/bin/python3
"""Speed benchmark of sd-txt2img on a model folder (issue 6).

For each image size it runs the CLI (DDIM, batch 1, guidance: one UNet call on
2 rows per step), reads the per-step times from its progress lines, and sets
them against the UNet's arithmetic: the GFLOP of one guided step, counted from
the architecture in model.json, divided by the fp32 bound: the better of two
fp32 GEMM peaks measured in the same run with the same thread count, OpenBLAS's
`torch.mm` and oneDNN's inner product (the CLI's Linear layers). Where the CPU
has avx512_bf16 or AMX it also measures a bf16 peak (a GEMM and a 3x3
convolution through oneDNN) and prints each step's ratio to it. It also times start to first step against
reading the model files from a warm cache, and prints the top operators of a
LibTorch profile of one UNet forward. The result is printed as a Markdown
block; --write-docs puts it between markers in docs/benchmarks.md.

Run with Debian's Python (python3-torch) and the export package on the path
(bench/bench_speed.sh does both), e.g.
    PYTHONPATH=python /usr/bin/python3 bench/bench_speed.py --model /tmp/sd15 --sizes 256 512 --steps 5 --threads 2
Small smoke test:
    PYTHONPATH=python /usr/bin/python3 bench/bench_speed.py --model /tmp/sd15 --sizes 64 128 --steps 2 \
        --threads 1 --gemm-n 1024 --conv 320,16,2 --profile-size 64
"""

import argparse
import ctypes
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_engine_lib():
    """The C++ operators (sd::attention's fused kernel, sd::linear's oneDNN call)
    for the profile, so that Python runs the exported modules as the CLI does.
    Loaded before sd_export, which otherwise defines them with plain references."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--engine-lib", default=os.path.join(ROOT, "build", "libsd_engine.so"))
    path = pre.parse_known_args()[0].engine_lib
    if path != "none" and os.path.exists(path):
        torch.ops.load_library(path)
        return path
    return None


ENGINE_LIB = _load_engine_lib()

from sd_export.stages import load_stage, weights_path  # noqa: E402 - after the engine's operators

BEGIN_MARK = "<!-- bench_speed:begin -->"
END_MARK = "<!-- bench_speed:end -->"
PROMPT = "a photograph of an astronaut riding a horse"


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- threads

def set_threads(threads):
    """The same two settings as the CLI's configure_runtime: ATen's pool and
    OpenBLAS's own count (torch.mm goes to OpenBLAS, which ignores ATen's)."""
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    lib = None
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
    except OSError:
        for line in open("/proc/self/maps"):
            path = line.split()[-1]
            if "openblas" in os.path.basename(path):
                lib = ctypes.CDLL(path)
                break
    if lib is not None and hasattr(lib, "openblas_set_num_threads"):
        lib.openblas_set_num_threads(threads)
        return "OpenBLAS"
    return "unknown BLAS (thread count not set)"


# --------------------------------------------------------------------------- peaks

def best_time(fn, repeats):
    fn()  # warm-up: first call allocates and picks kernels
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def gemm_peak(n, repeats):
    """fp32 GFLOP/s of an n x n x n torch.mm, best of `repeats` (2 n^3 FLOP)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    with torch.inference_mode():
        t = best_time(lambda: torch.mm(a, b, out=c), repeats)
    return 2.0 * n ** 3 / t / 1e9


def onednn_gemm_peak(n, repeats):
    """The same through sd::linear, i.e. oneDNN's inner product, which the CLI's
    Linear layers run on; None without the engine library."""
    if not ENGINE_LIB:
        return None
    a, w = torch.randn(n, n), torch.randn(n, n)
    with torch.inference_mode():
        t = best_time(lambda: torch.ops.sd.linear(a, w, None), repeats)
    return 2.0 * n ** 3 / t / 1e9


def conv_peak(channels, size, batch, repeats, dtype=torch.float32):
    """GFLOP/s of a 3x3 same-padding convolution channels->channels at size x size
    (bf16: LibTorch sends it to oneDNN's bf16 convolution, AMX where present)."""
    x = torch.randn(batch, channels, size, size).to(dtype)
    w = torch.randn(channels, channels, 3, 3).to(dtype)
    bias = torch.randn(channels).to(dtype)
    with torch.inference_mode():
        t = best_time(lambda: F.conv2d(x, w, bias, padding=1), repeats)
    return 2.0 * batch * channels * size * size * channels * 9 / t / 1e9


def bf16_gemm_peak(n, repeats):
    """bf16 GFLOP/s of an n x n x n product with fp32 accumulation: `torch.mm` on
    bf16 tensors (LibTorch 1.13 gives it to oneDNN's bf16 matmul on a CPU with
    avx512_bf16, AMX where present), and sd::linear on bf16 (the CLI's Linear
    layers with --precision bf16) when the engine library has it. The better."""
    a, b = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
    with torch.inference_mode():
        rates = {"torch.mm": 2.0 * n ** 3 / best_time(lambda: torch.mm(a, b), repeats) / 1e9}
        if ENGINE_LIB:
            rates["sd::linear"] = 2.0 * n ** 3 / best_time(lambda: torch.ops.sd.linear(a, b, None), repeats) / 1e9
    return rates


def cpu_bf16_flags(flags):
    """The CPU's bf16 instructions, as /proc/cpuinfo names them."""
    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]


# --------------------------------------------------------------------------- FLOP count

def build_unet_meta(arch, cls_name="UNetModel"):
    """sd_export.modules.UNetModel (or another class) from model.json's
    architecture, with every parameter on the meta device: no memory, no init,
    shapes only."""
    from sd_export import modules as sd_modules
    import torch.nn.init as init
    names = ("kaiming_uniform_", "uniform_", "normal_", "ones_", "zeros_", "xavier_uniform_",
             "constant_", "trunc_normal_")
    saved = {n: getattr(init, n) for n in names if hasattr(init, n)}
    real_empty = torch.empty

    def meta_empty(*a, **k):
        if k.get("device") is None:
            k["device"] = "meta"
        return real_empty(*a, **k)

    for n in saved:
        setattr(init, n, lambda t, *a, **k: t)
    torch.empty = meta_empty  # the layers' constructors call torch.empty for their weights
    try:
        model = getattr(sd_modules, cls_name)(**arch)
    finally:
        torch.empty = real_empty
        for n, f in saved.items():
            setattr(init, n, f)
    return model.eval()


def count_conv(acc, mod, out):
    """Adds one Conv2d call's FLOP to acc["conv3x3"] or acc["conv1x1"]."""
    kh, kw = mod.kernel_size
    acc["conv3x3" if (kh, kw) != (1, 1) else "conv1x1"] += 2 * out.numel() * (mod.in_channels // mod.groups) * kh * kw


def count_unet_flops(arch, h, w, rows, context_len, context_dim):
    """FLOP of one UNet forward on `rows` latents of h x w, multiply-add = 2 FLOP.

    Counted: every Conv2d and Linear (weights x activations; biases ignored) and
    attention's two batched matmuls per head (q k^T and softmax(.) v). Ignored:
    GroupNorm, LayerNorm, softmax, SiLU/GELU, residual adds, upsampling, concat
    (element-wise, under 1% of the total). Shapes come from a forward pass on
    meta tensors with hooks on those modules, so the count follows the
    architecture exactly as sd_export/modules builds it."""
    from sd_export import modules as sd_modules
    model = build_unet_meta(arch)
    n_params = sum(p.numel() for p in model.parameters())
    acc = {"conv3x3": 0, "conv1x1": 0, "linear": 0, "attention bmm": 0}

    def conv_hook(mod, inp, out):
        count_conv(acc, mod, out)

    def linear_hook(mod, inp, out):
        acc["linear"] += 2 * out.numel() * mod.in_features

    def attn_hook(mod, inp, out):
        x = inp[0]
        ctx = inp[1] if len(inp) > 1 and inp[1] is not None else x
        b, n = x.shape[0], x.shape[1]
        m = ctx.shape[1]
        # q k^T: [n, d] x [d, m]; w v: [n, m] x [m, d]; per head, per row
        acc["attention bmm"] += 2 * 2 * b * mod.heads * n * m * mod.dim_head

    for mod in model.modules():
        if isinstance(mod, nn.Conv2d):
            mod.register_forward_hook(conv_hook)
        elif isinstance(mod, nn.Linear):
            mod.register_forward_hook(linear_hook)
        elif isinstance(mod, sd_modules.CrossAttention):
            mod.register_forward_hook(attn_hook)
    x = torch.empty(rows, arch.get("in_channels", 4), h, w, device="meta")
    t = torch.zeros(rows, dtype=torch.long, device="meta")
    c = torch.empty(rows, context_len, context_dim, device="meta")
    # SDXL's UNet also takes its vector input (pooled text and size embeddings)
    y = torch.empty(rows, arch["adm_in_channels"], device="meta") if arch.get("adm_in_channels") else None
    with torch.no_grad():
        model(x, t, c) if y is None else model(x, t, c, y)
    acc["total"] = sum(acc.values())
    return acc, n_params


def count_vae_flops(arch, h, w):
    """FLOP of one VAE decode of an h x w latent, counted as count_unet_flops
    does: every Conv2d, and the mid block's one-head attention (two matmuls)."""
    from sd_export import modules as sd_modules
    model = build_unet_meta(arch, "VAEDecoder")
    acc = {"conv3x3": 0, "conv1x1": 0, "attention bmm": 0}

    def conv_hook(mod, inp, out):
        count_conv(acc, mod, out)

    def attn_hook(mod, inp, out):
        b, c, hh, ww = inp[0].shape
        acc["attention bmm"] += 2 * 2 * b * (hh * ww) ** 2 * c

    for mod in model.modules():
        if isinstance(mod, nn.Conv2d):
            mod.register_forward_hook(conv_hook)
        elif isinstance(mod, sd_modules.AttnBlock):
            mod.register_forward_hook(attn_hook)
    with torch.no_grad():
        model(torch.empty(1, arch.get("embed_dim", 4), h, w, device="meta"))
    acc["total"] = sum(acc.values())
    return acc


# --------------------------------------------------------------------------- CLI runs

def cli_flags(binary):
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
        return set(re.findall(r"(--[A-Za-z][\w-]*)", out.stdout + out.stderr))
    except (OSError, subprocess.TimeoutExpired):
        return set()


PROGRESS_RE = re.compile(r"step (\d+)/(\d+)\s+([0-9.]+) s/step")
TIMING_RE = re.compile(r"timing:\s*(.*)")


def parse_timing(text):
    """'text encoder load 1.23 s, UNet load 4.56 s, ...' -> {name: seconds}."""
    out = {}
    for part in text.split(","):
        m = re.match(r"\s*(.*?)\s+([0-9.]+)\s*s\s*$", part)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def run_cli(args, size, flags, outdir):
    cmd = [args.bin, "--model", args.model, "--prompt", PROMPT, "--H", str(size), "--W", str(size),
           "--steps", str(args.steps), "--sampler", "ddim", "--threads", str(args.threads), "--seed", "42",
           "--outdir", outdir]
    if "--verbose" in flags:
        cmd.append("--verbose")
    cmd += shlex.split(args.cli_args)
    log("running: " + " ".join(shlex.quote(c) for c in cmd))
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    # stderr is a pipe, so the CLI prints one progress line per step; each line
    # is stamped as it arrives (for start to first step when the CLI does not
    # report its own timing).
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1)
    steps, lines, timing = [], [], {}
    for line in proc.stderr:
        now = time.monotonic() - t0
        line = line.rstrip("\n")
        lines.append(line)
        m = PROGRESS_RE.search(line)
        if m:
            steps.append({"step": int(m.group(1)), "of": int(m.group(2)), "printed": float(m.group(3)), "at": now})
            log(f"  {size}²: step {m.group(1)}/{m.group(2)} {float(m.group(3)):.2f} s  (t={now:.1f} s)")
            continue
        m = TIMING_RE.search(line)
        if m:
            timing = parse_timing(m.group(1))
    # wait4 gives this child's own peak RSS and CPU time (getrusage would mix children)
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status
    wall = time.monotonic() - t0
    if proc.returncode != 0 or not steps:
        sys.exit(f"bench_speed: {' '.join(cmd)} failed (exit {proc.returncode}):\n" + "\n".join(lines[-20:]))
    skip = min(args.skip_steps, len(steps) - 1)
    later = [s["printed"] for s in steps[skip:]]
    # gaps between line arrivals: finer than the printed 2 decimals for short steps
    gaps = [b["at"] - a["at"] for a, b in zip(steps[skip - 1:], steps[skip:])] if skip else []
    return {
        "size": size, "cmd": cmd, "steps": steps, "wall": wall, "timing": timing,
        "s_per_step": statistics.mean(later),
        "s_per_step_gaps": statistics.mean(gaps) if gaps else None,
        "s_per_step_from": (f"mean of steps {skip + 1}-{len(steps)}" if skip
                            else f"mean of steps 1-{len(steps)} (step 1 includes loading)"),
        "first_line_at": steps[0]["at"],
        "max_rss_gib": ru.ru_maxrss / 1048576.0,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "load": (load_before, os.getloadavg()[0]),
        "stderr_tail": lines[-12:],
        "stderr_all": lines,
    }


def plan_text(args, size, flags):
    if "--plan" not in flags:
        return None
    cmd = [args.bin, "--model", args.model, "--prompt", PROMPT, "--H", str(size), "--W", str(size),
           "--steps", str(args.steps), "--sampler", "ddim", "--threads", str(args.threads)] + shlex.split(args.cli_args)
    out = subprocess.run(cmd + ["--plan"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    m = re.search(r"^\s*attention:\s*(.*)$", out.stdout, re.M)
    return m.group(1).strip() if m else None


def read_files_time(paths):
    """Seconds for `cat FILES > /dev/null` from a warm cache: run twice, time the second."""
    cmd = ["cat"] + paths
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    t0 = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - t0


# --------------------------------------------------------------------------- profile

def set_attention(module, attention):
    """attention: 'fused', 'full', 'per-head' or 'chunked[:N]', as the CLI's --attention."""
    chunk = None
    if attention.startswith("chunked"):
        mode, chunk = 2, int(attention.split(":", 1)[1]) if ":" in attention else 256
    else:
        mode = {"full": 0, "per-head": 1, "fused": 3}[attention]
    for _, mod in module.named_modules():
        if hasattr(mod, "attention_mode"):
            mod.attention_mode = mode
            if chunk is not None:
                mod.attention_chunk = chunk


def prepack(module):
    """What the CLI's prepack_convolutions does at load (src/engine/stage_loader.cpp):
    3x3 convolutions' fp32 (or bf16) weights replaced by oneDNN's blocked layout,
    and GEGLU's one-pass gate switched on (use_fused_rows)."""
    n = 0
    for _, mod in module.named_modules():
        if hasattr(mod, "fused_rows"):
            mod.fused_rows = 1
        if not hasattr(mod, "conv_split") or not hasattr(mod, "weight"):
            continue
        w = mod.weight
        if (w.dim() != 4 or w.is_mkldnn or w.dtype not in (torch.float32, torch.bfloat16)
                or w.shape[2] * w.shape[3] == 1
                or w.shape[0] % 16 or w.shape[1] % 16):
            continue
        mod.weight = torch._C._nn.mkldnn_reorder_conv2d_weight(
            w.to_mkldnn(), list(mod.padding), list(mod.stride), list(mod.dilation), mod.groups)
        n += 1
    return n


def profile_forward(module, inputs, warmup, shapes=False):
    times = []
    with torch.inference_mode():
        for _ in range(warmup):  # TorchScript profiles and optimises the graph on its first calls
            t0 = time.perf_counter()
            module(*inputs)
            times.append(time.perf_counter() - t0)
        with torch.autograd.profiler.profile(record_shapes=shapes) as prof:
            t0 = time.perf_counter()
            module(*inputs)
            profiled = time.perf_counter() - t0
    events = prof.key_averages(group_by_input_shape=shapes)
    total_self = sum(e.self_cpu_time_total for e in events) or 1.0
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"warmup_s": times, "profiled_s": profiled, "total_self_s": total_self / 1e6,
            "top": [(e.key + (" " + str(e.input_shapes) if shapes else ""), e.count, e.self_cpu_time_total / 1e6,
                     e.self_cpu_time_total / total_self) for e in top]}


def profile_unet(path, size, rows, warmup, attention, context_len, context_dim, latent_channels, factor,
                 shapes=False, packed=False, dtype=torch.float32):
    unet = load_stage(path).to(dtype)
    set_attention(unet, attention)
    n_packed = prepack(unet) if packed else 0
    h = w = size // factor
    inputs = (torch.randn(rows, latent_channels, h, w).to(dtype), torch.full((rows,), 501, dtype=torch.long),
              torch.randn(rows, context_len, context_dim).to(dtype))
    out = profile_forward(unet, inputs, warmup, shapes)
    out["packed"] = n_packed
    return out


def profile_vae(path, size, warmup, attention, latent_channels, factor, shapes=False, packed=False,
                dtype=torch.float32):
    vae = load_stage(path).to(dtype)
    set_attention(vae, attention)
    n_packed = prepack(vae) if packed else 0
    out = profile_forward(vae, (torch.randn(1, latent_channels, size // factor, size // factor).to(dtype),), warmup,
                          shapes)
    out["packed"] = n_packed
    return out


# --------------------------------------------------------------------------- report

def machine_info():
    name = None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"^Model name:\s*(.*)$", out, re.M)
        name = m.group(1).strip() if m else None
    except OSError:
        pass
    family = model = None
    flags = set()
    for line in open("/proc/cpuinfo"):
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "cpu family" and family is None:
            family = value.strip()
        elif key == "model" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16",
                         "amx_int8") if f in flags]
    cpus = len(os.sched_getaffinity(0))
    mem = None
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) / 1048576.0
    cpu = name or "unknown CPU"
    if family and model:
        cpu += f" (family {family} model {model})"
    return {"cpu": cpu, "flags": shown, "all_flags": sorted(flags), "nproc": cpus, "mem_gib": mem,
            "torch": torch.__version__}


def bf16_bound(peaks):
    """The best bf16 rate of this run (GEMM or convolution), or None where not measured."""
    rates = peaks.get("bf16")
    if not rates:
        return None
    return max(list(rates["gemm"].values()) + ([rates["conv"]] if rates.get("conv") else []))


def fp32_bound(peaks):
    """The fp32 bound: the better of OpenBLAS's and oneDNN's GEMM peaks of this run, and which it was."""
    blas, dnnl = max(peaks["gemm"]), max(peaks.get("onednn_all") or [0.0])
    return (dnnl, "oneDNN (`sd::linear`)") if dnnl > blas else (blas, "OpenBLAS (`torch.mm`)")


def marks(label):
    if not label:
        return BEGIN_MARK, END_MARK
    return f"<!-- bench_speed:{label}:begin -->", f"<!-- bench_speed:{label}:end -->"


def markdown(args, info, blas, peaks, flops, runs, profile, vae_profile, read_s, command):
    peak, peak_from = fp32_bound(peaks)
    begin, end = marks(args.label)
    L = [begin, "", f"### Speed: {args.label}" if args.label else "## Speed profile (issue 6)", ""]
    load = ""
    if runs:
        load = (" Load average (1 min) before-after each CLI run: "
                + ", ".join(f"{r['load'][0]:.1f}-{r['load'][1]:.1f}" for r in runs) + ".")
    L.append(f"Generated by `bench/bench_speed.py` on {time.strftime('%Y-%m-%d %H:%M')}. "
             f"Machine: {info['cpu']}, flags {' '.join(info['flags']) or 'none of note'}, "
             f"{info['nproc']} CPUs (nproc), "
             f"{info['mem_gib']:.0f} GiB RAM, torch {info['torch']} ({blas}); "
             f"threads used: {args.threads}. Load average (1 min) at the peak measurements: "
             + ", ".join(f"{x:.1f}" for x in peaks["load"]) + "." + load)
    L += ["", "```", command, "```", ""]
    L.append(f"Model: `{args.model}` (UNet {flops['params'] / 1e6:.1f} M parameters), DDIM, batch 1, guidance "
             f"(one UNet call on 2 rows per step), {runs[0]['steps'][0]['of'] if runs else args.steps} steps.")
    L.append("")
    gemm_s = ", ".join(f"{g:.1f}" for g in peaks["gemm"])
    dnnl_s = ", ".join(f"{g:.1f}" for g in peaks.get("onednn_all") or [])
    L.append(f"fp32 bound: **{peak:.1f} GFLOP/s**, the better of two {args.gemm_n}x{args.gemm_n} fp32 products "
             f"measured in this run, {args.threads} thread(s), best of {args.repeats} each"
             + (", before and after the CLI runs" if len(peaks["gemm"]) > 1 else "")
             + f": OpenBLAS `torch.mm` {gemm_s}; oneDNN inner product (`sd::linear`, the CLI's Linear "
             f"layers) {dnnl_s or 'not measured (no engine library)'}. Used: {peak_from}.")
    if peaks.get("conv"):
        c, s, b = peaks["conv_cfg"]
        L.append(f"Convolution for comparison: fp32 conv3x3 {c}->{c} at {s}x{s}, batch {b}: "
                 f"{peaks['conv']:.1f} GFLOP/s ({peaks['conv'] / peak:.2f} of the fp32 bound).")
    if peaks.get("bf16"):
        rates = peaks["bf16"]
        L.append(f"bf16 peak (the CPU has {', '.join(info['bf16_flags'])}): {args.gemm_n}x{args.gemm_n} product "
                 + ", ".join(f"{k} {v:.1f}" for k, v in rates["gemm"].items())
                 + (f"; conv3x3 {c}->{c} at {s}x{s}, batch {b}: {rates['conv']:.1f}" if rates.get("conv") else "")
                 + f" GFLOP/s. bf16 bound: **{bf16_bound(peaks):.1f} GFLOP/s** (the best of these), "
                 f"{bf16_bound(peaks) / peak:.2f}x the fp32 bound.")
    elif info.get("bf16_flags") == []:
        L.append("bf16 peak: not measured (the CPU has neither avx512_bf16 nor amx_bf16).")
    L.append("")
    if runs:
        L.append(f"fp32 bound used below: {peak:.1f} GFLOP/s ({peak_from}).")
        L.append("")
        L.append("| size | run | UNet GFLOP/step | s/step | achieved GFLOP/s | of fp32 bound | lower bound s/step "
                 "| s/step / bound | VAE decode s | VAE bound s | decode / bound | start to first step "
                 "| read files (warm) | peak RSS |")
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in runs:
            gf = flops["per_step"][r["size"]] / 1e9
            achieved = gf / r["s_per_step"]
            bound = gf / peak
            sfs, how = start_to_first_step(r)
            vae_bound = flops["vae"][r["size"]]["total"] / 1e9 / peak
            dec = r["timing"].get("last decode")
            dec_s = f"{dec:.2f} | {vae_bound:.2f} | {dec / vae_bound:.2f}" if dec else f"- | {vae_bound:.2f} | -"
            L.append(f"| {r['size']}² | {r['run']} | {gf:.1f} | {r['s_per_step']:.2f} | {achieved:.1f} "
                     f"| {achieved / peak:.2f} | {bound:.2f} | {r['s_per_step'] / bound:.2f} | {dec_s} "
                     f"| {sfs:.1f} s{how} | {read_s:.1f} s | {r['max_rss_gib']:.2f} GiB |")
        L.append("")
        for size in sorted({r["size"] for r in runs}):
            rs = [r for r in runs if r["size"] == size]
            gf = flops["per_step"][size] / 1e9
            ratio = statistics.median(r["s_per_step"] for r in rs) / (gf / peak)
            decs = [r["timing"]["last decode"] for r in rs if "last decode" in r["timing"]]
            vae_gf = flops["vae"][size]["total"] / 1e9
            bf16 = bf16_bound(peaks)
            L.append(f"{size}², median of {len(rs)} run(s): step / fp32 bound **{ratio:.2f}**"
                     + (f", VAE decode / bound **{statistics.median(decs) / (vae_gf / peak):.2f}** "
                        f"(VAE {vae_gf:.0f} GFLOP)" if decs else "")
                     + (f"; step / bf16 bound {ratio * bf16 / peak:.2f}" if bf16 else "") + ".")
        L.append("")
        L.append("Per step (s, as printed by the CLI): "
                 + "; ".join(f"{r['size']}²: " + ", ".join(f"{s['printed']:.2f}" for s in r["steps"]) for r in runs)
                 + ".")
        L.append("CPU time of the CLI / its wall time (cores kept busy; below the thread count when the machine "
                 "is shared or the run waits on I/O): "
                 + "; ".join(f"{r['size']}²: {r['cpu_s'] / r['wall']:.2f}" for r in runs) + ".")
        attn = [f"{r['size']}²: {r['attention']}" for r in runs if r.get("attention")]
        if attn:
            L.append("Planner's attention choice: " + "; ".join(attn) + ".")
        L.append("")
        L.append("* s/step: " + runs[0]["s_per_step_from"] + " as the CLI prints them (each step's own time); "
                 "step 1 also holds loading and prompt encoding (the CLI turns TorchScript's graph "
                 "optimiser off, so later steps are alike).")
        L.append("* UNet GFLOP/step: one forward on 2 rows, counted from the architecture in `model.json` "
                 "(Conv2d, Linear, attention's q·kᵀ and w·v per head; multiply-add = 2 FLOP; GroupNorm, "
                 "LayerNorm, softmax, activations and element-wise ops ignored).")
        L.append("* lower bound: UNet GFLOP/step / fp32 bound, i.e. every FLOP at the better fp32 GEMM rate of "
                 "this run; s/step / bound = fp32 bound / achieved. The bf16 ratio, where printed, sets the step "
                 "against the bf16 bound instead (what a bf16 run could reach).")
        L.append("* VAE decode: the CLI's `last decode` time; its bound: the decoder's GFLOP (Conv2d and the mid "
                 "block's attention, counted the same way) / fp32 bound.")
        L.append("* start to first step: " + ("the CLI's own `timing:` line (`--verbose`)"
                 if any(r["timing"] for r in runs) else
                 "wall time from process start to the first progress line, minus one steady step (s/step)")
                 + "; read files: `cat " + " ".join(read_files_names(args)) + " > /dev/null`, second of two runs.")
    kernel = (f"; sd::attention and sd::linear from `{os.path.relpath(ENGINE_LIB, ROOT)}`" if ENGINE_LIB else
              "; sd::attention and sd::linear: the Python references (no --engine-lib)")
    for what, prof in (("UNet forward (`unet.pt`", profile), ("VAE decode (`vae_decoder.pt`", vae_profile)):
        if not prof:
            continue
        rows = f"{args.profile_rows} rows, " if prof is profile else ""
        gf = (flops["profile"] if prof is profile else flops["vae"][prof["size"]]["total"]) / 1e9
        L.append("")
        L.append(f"Top operators, LibTorch profile of one {what}, {prof['size']}², {rows}attention "
                 f"{args.profile_attention}, {prof['packed']} convolutions prepacked{kernel}; after "
                 f"{args.profile_warmup} warm-up call(s); {prof['profiled_s']:.2f} s under the profiler, "
                 f"{gf:.1f} GFLOP = {gf / prof['profiled_s']:.1f} GFLOP/s), by self CPU time:")
        L.append("")
        L.append("| operator | calls | self CPU (s) | share |")
        L.append("| --- | --- | --- | --- |")
        for name, count, s, share in prof["top"][:args.profile_top]:
            L.append(f"| `{name}` | {count} | {s:.3f} | {100 * share:.1f}% |")
    L += ["", end]
    return "\n".join(L) + "\n"


def start_to_first_step(r):
    t = r["timing"]
    if "start to first step" in t:
        return t["start to first step"], ""
    # the first progress line comes at the end of step 1: take one steady step off
    return max(0.0, r["first_line_at"] - r["s_per_step"]), " (est.)"


def read_files_names(args):
    """The three stages' files, and their weight files where the export wrote them."""
    files = json.load(open(os.path.join(args.model, "model.json"))).get("files", {})
    names = [files.get(k, k + ".pt") for k in ("text_encoder", "unet", "vae_decoder")]
    return names + [weights_path(n) for n in names if os.path.exists(os.path.join(args.model, weights_path(n)))]


def command_args(argv):
    """argv without the options that only say where the report goes."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--write-docs",) or a.startswith(("--docs=", "--json=")):
            pass
        elif a in ("--docs", "--json"):
            skip = True
        else:
            out.append(a)
    return out


def write_docs(path, block, label):
    begin, end = marks(label)
    text = open(path).read() if os.path.exists(path) else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + block.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (scripts/export_model.py output)")
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512], help="image sizes (square)")
    p.add_argument("--steps", type=int, default=5, help="DDIM steps per run (must suit the CompVis schedule)")
    p.add_argument("--threads", type=int, default=2, help="threads for the CLI, the GEMM peak and the profile")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "sd-txt2img"), help="sd-txt2img binary")
    p.add_argument("--cli-args", default="",
                   help="extra CLI arguments, one shell-quoted string (e.g. '--attention full')")
    p.add_argument("--gemm-n", type=int, default=2048, help="matrix edge of the GEMM peak")
    p.add_argument("--repeats", type=int, default=5, help="repeats of the GEMM and conv peaks (best counts)")
    p.add_argument("--conv", default="320,64,2",
                   help="CHANNELS,SIZE,BATCH of the conv3x3 peak shown beside the GEMM one; 'none' to skip")
    p.add_argument("--profile-size", type=int, default=256, help="image size of the profiled UNet forward; 0 skips it")
    p.add_argument("--profile-rows", type=int, default=2, help="rows of the profiled forward (2 = guided batch 1)")
    p.add_argument("--runs", type=int, default=1, help="CLI runs per size (each reported)")
    p.add_argument("--label", default="",
                   help="names the report and its markers in --docs (one block per label)")
    p.add_argument("--engine-lib", default=os.path.join(ROOT, "build", "libsd_engine.so"),
                   help="library whose sd::attention kernel the profile uses ('none': the Python reference)")
    p.add_argument("--profile-prepack", choices=("auto", "on", "off"), default="auto",
                   help="prepack the profiled stages' convolutions (auto: unless --cli-args has '--prepack off')")
    p.add_argument("--profile-vae-size", type=int, default=256,
                   help="image size of the profiled VAE decode; 0 skips it")
    p.add_argument("--skip-steps", type=int, default=1,
                   help="leading steps left out of s/step (at least one step is always kept)")
    p.add_argument("--profile-warmup", type=int, default=2,
                   help="unprofiled forwards before the profiled one (TorchScript profiles the 1st call, "
                        "optimises on the 2nd)")
    p.add_argument("--profile-shapes", action="store_true", help="group the profile's operators by input shapes")
    p.add_argument("--profile-attention", default="auto",
                   help="full, per-head or chunked[:N] in the profile; auto: what the CLI's planner picks "
                        "(--plan), per-head (the export's default) when it cannot tell")
    p.add_argument("--profile-top", type=int, default=15, help="operators listed")
    p.add_argument("--no-cli", action="store_true", help="skip the CLI runs (peaks, FLOP count and profile only)")
    p.add_argument("--flops-only", action="store_true", help="print the UNet FLOP count per size and exit")
    p.add_argument("--json", metavar="FILE", help="also write all measurements as JSON")
    p.add_argument("--write-docs", action="store_true", help="put the Markdown block into --docs between its markers")
    p.add_argument("--docs", default=os.path.join(ROOT, "docs", "benchmarks.md"), help="file for --write-docs")
    args = p.parse_args()

    cfg = json.load(open(os.path.join(args.model, "model.json")))
    arch = cfg.get("architecture", {}).get("unet")
    if arch is None:
        sys.exit("bench_speed: model.json has no architecture.unet (export it again with scripts/export_model.py)")
    factor = cfg.get("downsample_factor", 8)
    ctx_len, ctx_dim = cfg.get("context_length", 77), cfg.get("context_dim", 768)
    for s in args.sizes + ([args.profile_size] if args.profile_size else []):
        if s % cfg.get("size_multiple", 64):
            sys.exit(f"bench_speed: size {s} is not a multiple of the model's size_multiple {cfg.get('size_multiple')}")

    # FLOP count: cheap (meta tensors), so first
    flops = {"per_step": {}, "one_row": {}}
    for s in sorted(set(args.sizes + ([args.profile_size] if args.profile_size else []))):
        h = s // factor
        one, n_params = count_unet_flops(arch, h, h, 1, ctx_len, ctx_dim)
        two, _ = count_unet_flops(arch, h, h, 2, ctx_len, ctx_dim)
        flops["params"] = n_params
        flops["one_row"][s] = one
        flops["per_step"][s] = two["total"]
        print(f"UNet forward at {s}² ({h}x{h} latent): 1 row {one['total'] / 1e9:.1f} GFLOP "
              f"(conv3x3 {one['conv3x3'] / 1e9:.1f}, conv1x1 {one['conv1x1'] / 1e9:.1f}, "
              f"linear {one['linear'] / 1e9:.1f}, attention bmm {one['attention bmm'] / 1e9:.1f}); "
              f"guided step (2 rows) {two['total'] / 1e9:.1f} GFLOP")
    flops["vae"] = {}
    for s in sorted(set(args.sizes + ([args.profile_vae_size] if args.profile_vae_size else []))):
        flops["vae"][s] = count_vae_flops(cfg["architecture"]["vae"], s // factor, s // factor)
        print(f"VAE decode at {s}²: {flops['vae'][s]['total'] / 1e9:.1f} GFLOP "
              f"(attention bmm {flops['vae'][s]['attention bmm'] / 1e9:.1f})")
    if args.profile_size:
        flops["profile"] = count_unet_flops(arch, args.profile_size // factor, args.profile_size // factor,
                                            args.profile_rows, ctx_len, ctx_dim)[0]["total"]
    if args.flops_only:
        return

    info = machine_info()
    blas = set_threads(args.threads)
    peaks = {"gemm": [], "load": [os.getloadavg()[0]]}
    log(f"GEMM peak: torch.mm {args.gemm_n}², {args.threads} thread(s) ({blas})")
    peaks["gemm"].append(gemm_peak(args.gemm_n, args.repeats))
    log(f"  {peaks['gemm'][-1]:.1f} GFLOP/s")
    peaks["onednn"] = onednn_gemm_peak(args.gemm_n, args.repeats)
    peaks["onednn_all"] = [peaks["onednn"]] if peaks["onednn"] else []
    if peaks["onednn"]:
        log(f"sd::linear {args.gemm_n}² (oneDNN): {peaks['onednn']:.1f} GFLOP/s")
    if args.conv != "none":
        c, s, b = (int(v) for v in args.conv.split(","))
        peaks["conv_cfg"] = (c, s, b)
        peaks["conv"] = conv_peak(c, s, b, args.repeats)
        log(f"conv3x3 {c}->{c} {s}² batch {b}: {peaks['conv']:.1f} GFLOP/s")
    info["bf16_flags"] = cpu_bf16_flags(info["all_flags"])
    if info["bf16_flags"]:
        peaks["bf16"] = {"gemm": bf16_gemm_peak(args.gemm_n, args.repeats)}
        if args.conv != "none":
            peaks["bf16"]["conv"] = conv_peak(c, s, b, args.repeats, torch.bfloat16)
        log("bf16 peak: " + ", ".join(f"{k} {v:.1f}" for k, v in peaks["bf16"]["gemm"].items())
            + (f", conv3x3 {peaks['bf16']['conv']:.1f}" if "conv" in peaks["bf16"] else "") + " GFLOP/s")

    runs, read_s = [], None
    if not args.no_cli:
        if not os.access(args.bin, os.X_OK):
            sys.exit(f"bench_speed: {args.bin} is not an executable (build it, or give --bin)")
        flags = cli_flags(args.bin)
        files = [os.path.join(args.model, f) for f in read_files_names(args)]
        read_s = read_files_time(files)
        log(f"cat model files (warm): {read_s:.2f} s")
        outdir = tempfile.mkdtemp(prefix="bench_speed.")
        try:
            for s, run in [(s, i + 1) for s in args.sizes for i in range(args.runs)]:
                r = run_cli(args, s, flags, outdir)
                r["run"] = run
                # --verbose prints the memory plan after the run; else ask --plan
                planned = [m.group(1).strip() for m in map(re.compile(r"^\s*attention:\s*(.*)$").match,
                                                           r["stderr_all"]) if m]
                r["attention"] = planned[-1] if planned else plan_text(args, s, flags)
                del r["stderr_all"]
                runs.append(r)
                gf = flops["per_step"][s] / 1e9
                log(f"{s}²: {r['s_per_step']:.2f} s/step ({r['s_per_step_from']}), {gf / r['s_per_step']:.1f} GFLOP/s")
        finally:
            shutil.rmtree(outdir, ignore_errors=True)
        # a second GEMM measurement after the runs shows whether the machine's load changed meanwhile
        peaks["gemm"].append(gemm_peak(args.gemm_n, args.repeats))
        log(f"GEMM peak after the runs: {peaks['gemm'][-1]:.1f} GFLOP/s")
        after = onednn_gemm_peak(args.gemm_n, args.repeats)
        if after:
            peaks["onednn_all"].append(after)
            log(f"sd::linear after the runs: {after:.1f} GFLOP/s")
        peaks["load"].append(os.getloadavg()[0])

    profile = vae_profile = None
    cli_words = shlex.split(args.cli_args)
    prepack_off = "--prepack=off" in cli_words or ["--prepack", "off"] in map(list, zip(cli_words, cli_words[1:]))
    packed = args.profile_prepack == "on" or args.profile_prepack == "auto" and not prepack_off
    # the profile computes as the CLI runs were asked to (--precision bf16: bf16 modules and inputs)
    bf16 = "--precision=bf16" in cli_words or ["--precision", "bf16"] in map(list, zip(cli_words, cli_words[1:]))
    dtype = torch.bfloat16 if bf16 else torch.float32
    if args.profile_size or args.profile_vae_size:
        if args.profile_attention == "auto":
            planned = plan_text(args, args.profile_size, cli_flags(args.bin)) if os.access(args.bin, os.X_OK) else None
            args.profile_attention = planned.split(",")[0].strip() if planned else "per-head"
    if args.profile_size:
        log(f"profiling one UNet forward at {args.profile_size}², {args.profile_rows} rows")
        profile = profile_unet(os.path.join(args.model, cfg.get("files", {}).get("unet", "unet.pt")),
                               args.profile_size, args.profile_rows, args.profile_warmup, args.profile_attention,
                               ctx_len, ctx_dim, cfg.get("latent_channels", 4), factor, args.profile_shapes, packed,
                               dtype)
        profile["size"] = args.profile_size
    if args.profile_vae_size:
        log(f"profiling one VAE decode at {args.profile_vae_size}²")
        vae_profile = profile_vae(os.path.join(args.model, cfg.get("files", {}).get("vae_decoder", "vae_decoder.pt")),
                                  args.profile_vae_size, args.profile_warmup, args.profile_attention,
                                  cfg.get("latent_channels", 4), factor, args.profile_shapes, packed, dtype)
        vae_profile["size"] = args.profile_vae_size

    command = "/usr/bin/python3 bench/bench_speed.py " + " ".join(shlex.quote(a) for a in command_args(sys.argv[1:]))
    block = markdown(args, info, blas, peaks, flops, runs, profile, vae_profile, read_s, command)
    print(block)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "peaks": peaks, "flops": flops, "runs": runs, "profile": profile,
                   "vae_profile": vae_profile,
                       "read_files_s": read_s, "args": vars(args)}, f, indent=1, default=str)
    if args.write_docs:
        write_docs(args.docs, block, args.label)
        log(f"wrote the block into {args.docs}")


if __name__ == "__main__":
    main()
