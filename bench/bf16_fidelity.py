#!/usr/bin/python3
"""How far --precision bf16 moves a picture from fp32 (issue 34).

Runs the CLI twice per case, --precision fp32 and --precision bf16, with the
case's own settings (a conformance case folder's args.json: prompt, seed, size,
sampler, steps, scale), and prints a Markdown table: the final latents'
relative RMS difference (||bf16 - fp32|| / ||fp32||, from --save-latents) and
the PSNR of the bf16 PNG against the fp32 one (8-bit, peak 255).

    /usr/bin/python3 bench/bf16_fidelity.py --model build/test-models/tiny-st \\
        ../shared/conformance/tiny/cases/p*_*
Extra CLI arguments for every run: --cli-args '--threads 2'.
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def case_args(case_dir):
    a = json.load(open(os.path.join(case_dir, "args.json")))
    sampler = {"euler_ancestral": "euler_a"}.get(a["sampler"], a["sampler"])
    steps = a.get("steps_requested", a.get("steps"))
    prompts = a["prompts"]
    if len(set(prompts)) != 1:
        return None  # one prompt per case here; batches of different prompts are left out
    return ["--seed", str(a["seed"]), "--H", str(a["H"]), "--W", str(a["W"]), "--steps", str(steps),
            "--sampler", sampler, "--scale", str(a["scale"]), "--n_samples", str(a["n_samples"]),
            "--prompt", prompts[0]]


def run(binary, model, args, precision, out, extra):
    os.makedirs(out, exist_ok=True)
    cmd = [binary, "--model", model, "--outdir", out, "--quiet", "--precision", precision,
           "--save-latents", os.path.join(out, "latents.npy")] + args + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bf16_fidelity: {' '.join(map(shlex.quote, cmd))} failed:\n{r.stderr}")
    pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
    return np.load(os.path.join(out, "latents.npy")), [np.asarray(Image.open(os.path.join(out, p)).convert("RGB"))
                                                       for p in pngs]


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "sd-txt2img"))
    p.add_argument("--cli-args", default="", help="extra CLI arguments for every run, one shell-quoted string")
    p.add_argument("--args", default="", help="instead of case folders: the run's own CLI arguments")
    p.add_argument("cases", nargs="*", help="conformance case folders (args.json)")
    a = p.parse_args()
    extra = shlex.split(a.cli_args)
    runs = [(os.path.basename(c.rstrip("/")), case_args(c)) for c in a.cases]
    if a.args:
        runs.append(("--args " + a.args, shlex.split(a.args)))
    rows = ["| case | latents rel. RMS (bf16 vs fp32) | image PSNR (dB) |", "| --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in runs:
            if args is None:
                continue
            l32, i32 = run(a.bin, a.model, args, "fp32", os.path.join(tmp, name, "fp32"), extra)
            l16, i16 = run(a.bin, a.model, args, "bf16", os.path.join(tmp, name, "bf16"), extra)
            rel = float(np.linalg.norm(l16 - l32) / np.linalg.norm(l32))
            ps = min(psnr(x, y) for x, y in zip(i32, i16))
            rows.append(f"| {name} | {rel:.4f} | {ps:.1f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
