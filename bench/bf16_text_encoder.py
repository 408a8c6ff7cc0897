#!/usr/bin/python3
"""How far a bf16 text encoder moves the conditioning from fp32's, and what it saves (issue 34).

--precision bf16 holds the text encoder in bf16 and runs it in bf16 (AMX where present); the
other precisions keep it fp32. This runs an exported model's text_encoder.pt both ways on a few
prompts and prints, per prompt, the conditioning's relative RMS difference
(||bf16 - fp32|| / ||fp32|| over the whole [77, width] output) and its largest difference. (The time
it saves is the CLI's: `--verbose` prints "first prompts encoded in".)

    /usr/bin/python3 bench/bf16_text_encoder.py --model build/test-models/tiny-st
Prompts are tokenized with models/demo's small CLIP tokenizer (plain lowercase ASCII).
"""

import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "models", "demo")]

from sd_export.stages import load_stage  # noqa: E402
from train_demo import ClipTokenizer  # noqa: E402

PROMPTS = ["a photograph of an astronaut riding a horse",
           "a red cube on a blue table, studio lighting",
           "portrait of an old fisherman, oil painting, highly detailed",
           ""]


def token_ids(tokenizer, info, prompt):
    ctx = info["context_length"]
    ids = [info["bos_id"]] + tokenizer.encode(prompt)[:ctx - 2] + [info["eos_id"]]
    return torch.tensor([ids + [info["pad_id"]] * (ctx - len(ids))])


def encode(module, ids):
    with torch.inference_mode():
        return module(ids).float()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="an exported model folder")
    args = p.parse_args()
    info = json.load(open(os.path.join(args.model, "model.json")))
    tokenizer = ClipTokenizer(os.path.join(ROOT, "models", "clip"))
    path = os.path.join(args.model, info["files"]["text_encoder"])
    fp32 = load_stage(path).float()
    bf16 = load_stage(path).to(torch.bfloat16)  # a bf16 export's file holds these same values
    print("| prompt | conditioning rel. RMS (bf16 vs fp32) | max abs diff |")
    print("| --- | --- | --- |")
    for prompt in PROMPTS:
        ids = token_ids(tokenizer, info, prompt)
        a, b = encode(fp32, ids), encode(bf16, ids)
        rel = ((b - a).norm() / a.norm()).item()
        print(f"| {prompt or '(empty)'} | {rel:.4f} | {(b - a).abs().max().item():.3g} |")


if __name__ == "__main__":
    main()
