#!/usr/bin/python3
"""Few-step benchmark (issue 19): seconds per image end to end and peak RSS.

Runs the CLI once per configuration under /usr/bin/time -v, 512x512 by default,
in one process after another on the same machine, and prints a Markdown block;
--write-docs puts it between its markers in docs/benchmarks.md. Configurations:
PLMS 50 steps at scale 7.5 (the CompVis default; --skip-plms leaves it out),
LCM 4 steps at scale 1, the same decoded by TAESD, the same with a LoRA merged
at load, and the Turbo recipe (Euler a, trailing, 1 step, scale 1) on an
SD 2.x-layout model. The VAE and TAESD decode times are the CLI's own
--verbose figures.

    /usr/bin/python3 bench/bench_fewstep.py --model /tmp/sd15 --model2 /tmp/sd21 \\
        --taesd tests/fixtures/taesd/taesd_decoder.pth --lora /tmp/lora-r64.safetensors --write-docs

The models: scripts/export_model.py --random-init (SD 1.5 sizes; with an SD 2.x
LDM config for --model2); the LoRA: bench/make_random_lora.py.
"""

import argparse
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN_MARK = "<!-- bench_fewstep:begin -->"
END_MARK = "<!-- bench_fewstep:end -->"
PROMPT = "a photograph of an astronaut riding a horse"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = re.search(r"model name\s*:\s*(.*)", text)
    flags = re.search(r"flags\s*:\s*(.*)", text)
    isa = "AVX-512" if flags and "avx512f" in flags.group(1).split() else "AVX2"
    bf16 = " (bf16)" if flags and "avx512_bf16" in flags.group(1).split() else ""
    return f"{name.group(1).strip() if name else 'unknown CPU'}, {os.cpu_count()} vCPUs, {isa}{bf16}"


def run_one(binary, model, flags, size, threads, outdir):
    cmd = [binary, "--model", model, "--prompt", PROMPT, "--seed", "1", "--H", str(size), "--W", str(size),
           "--threads", str(threads), "--outdir", outdir, "--verbose"] + flags
    t0 = time.time()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"bench_fewstep: failed ({p.returncode}): {shlex.join(cmd)}\n{p.stderr[-2000:]}")
    # --verbose resets the kernel's peak counter at each stage, so /usr/bin/time's
    # figure covers the last stage only: the run's peak is the largest stage peak.
    stages = {m.group(1): gib(m.group(2)) for m in
              re.finditer(r"^\s*(text encoder|unet|vae decoder)\s+peak: .*measured ([0-9.]+ [GM]iB)", p.stderr, re.M)}
    decode = re.search(r"last decode ([0-9.]+) s", p.stderr)
    return {"cmd": cmd, "wall": wall, "rss_gib": max(stages.values()) if stages else float("nan"),
            "unet_gib": stages.get("unet", float("nan")),
            "decode_s": float(decode.group(1)) if decode else None, "stderr": p.stderr}


def gib(text):
    value, unit = text.split()
    return float(value) / (1024 if unit == "MiB" else 1)


def shown(cmd, outdir):
    """A command line as the docs show it: the binary relative to the checkout, OUT for the temporary folder."""
    cmd = [os.path.relpath(c, ROOT) if i == 0 else ("OUT" if c == outdir else c) for i, c in enumerate(cmd)]
    return shlex.join(cmd)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="SD 1.5-size model folder")
    p.add_argument("--model2", help="SD 2.x-layout model folder for the Turbo row")
    p.add_argument("--taesd", help="TAESD decoder file (taesd_decoder.pth or a diffusers folder)")
    p.add_argument("--lora", help="a LoRA .safetensors for the merged-at-load row")
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-plms", action="store_true", help="leave out PLMS 50 steps (15 minutes here)")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "sd-txt2img"))
    p.add_argument("--write-docs", action="store_true")
    p.add_argument("--docs", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    a = p.parse_args()

    lcm = ["--sampler", "lcm", "--steps", "4", "--scale", "1"]
    rows = []
    if not a.skip_plms:
        rows.append(("PLMS 50 steps, scale 7.5", a.model, ["--sampler", "plms", "--steps", "50", "--scale", "7.5"]))
    rows.append(("LCM 4 steps, scale 1", a.model, lcm))
    if a.taesd:
        rows.append(("LCM 4 steps, scale 1, TAESD decoder", a.model, lcm + ["--vae-decoder", "taesd:" + a.taesd]))
    if a.lora:
        rows.append(("LCM 4 steps, scale 1, LoRA merged at load", a.model, lcm + ["--lora", a.lora]))
    if a.model2:
        rows.append(("Turbo: Euler a, trailing, 1 step, scale 1 (SD 2.x layout)", a.model2,
                     ["--sampler", "euler_a", "--schedule", "trailing", "--steps", "1", "--scale", "1"]))

    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = []
    with tempfile.TemporaryDirectory() as out:
        for name, model, flags in rows:
            r = run_one(a.bin, model, flags, a.size, a.threads, out)
            print(f"{name}: {r['wall']:.1f} s, peak RSS {r['rss_gib']:.2f} GiB", file=sys.stderr, flush=True)
            r["shown"] = shown(r["cmd"], out)
            results.append((name, r))
    load_after = os.getloadavg()

    L = [BEGIN_MARK, "", f"## Few-step images, {a.size}x{a.size} (issue 19)", ""]
    L.append(f"{cpu_name()}; {a.threads} threads; {started}; load average {load_before[0]:.1f} before, "
             f"{load_after[0]:.1f} after. One run each, one after another, in this order:")
    L += ["", "```sh", shlex.join(["/usr/bin/python3", "bench/bench_fewstep.py"] + sys.argv[1:]), "```", ""]
    L += ["Peak RSS is the largest of the stage peaks `--verbose` measures (it resets the kernel's counter at "
          "each stage, so `/usr/bin/time` would see the last stage only); the UNet stage's, where a LoRA is "
          "merged, beside it.", ""]
    L += ["| configuration | seconds per image (end to end) | peak RSS | UNet stage peak | decode |",
          "| --- | --- | --- | --- | --- |"]
    for name, r in results:
        dec = f"{r['decode_s']:.1f} s" if r["decode_s"] is not None else "-"
        L.append(f"| {name} | {r['wall']:.1f} | {r['rss_gib']:.2f} GiB | {r['unet_gib']:.2f} GiB | {dec} |")
    base = dict(results).get("LCM 4 steps, scale 1")
    merged = dict(results).get("LCM 4 steps, scale 1, LoRA merged at load")
    if base and merged:
        L += ["", f"The LoRA merged at load adds {100 * (merged['rss_gib'] / base['rss_gib'] - 1):+.1f}% to peak RSS "
              f"({100 * (merged['unet_gib'] / base['unet_gib'] - 1):+.1f}% to the UNet stage's peak)."]
    L += ["", "Each command: `build/sd-txt2img --model M --prompt '" + PROMPT + "' ...` with the flags of its row; "
          "full lines:", ""]
    for name, r in results:
        L.append(f"- {name}: `{r['shown']}`")
    L += ["", END_MARK]
    block = "\n".join(L)
    print(block)
    if a.write_docs:
        with open(a.docs) as f:
            text = f.read()
        if BEGIN_MARK in text and END_MARK in text:
            head, rest = text.split(BEGIN_MARK, 1)
            text = head + block + rest.split(END_MARK, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        with open(a.docs, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
