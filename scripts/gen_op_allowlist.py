#!/usr/bin/python3
"""Writes src/io/op_allowlist.inc: every operation, attribute and method name that the
TorchScript code of this tool's exports uses. The CLI refuses a model file whose code
names anything else (src/io/code_check.cpp, README "Security").

    gen_op_allowlist.py [--out src/io/op_allowlist.inc] [--check]

It exports, with random weights, every kind of module scripts/export_model.py writes:
SD 1.x (CLIP text encoder, convolution projections), SD 2.x (OpenCLIP text tower, linear
projections, head size), the demo model, the full-size SD 1.x and 2.x layouts at small
widths, the other projection type of each family, transformer depth 2, a VAE (decoder and
encoder) with attention levels and fp16 weights, and SDXL (two text encoders, the UNet's vector input);
then reads the code/ records of the written .pt files.
--check compares with the file instead of writing it (exit 1 when they differ). Run with
/usr/bin/python3 (Debian's python3-torch).

What is listed (the grammar is in names_in_code; src/io/code_check.cpp reads code the same way):
  torch.NAME       a builtin operation (aten::NAME), also spelled torch.autograd.NAME
  ops.NS.NAME      any registered operation (ops.prim.dtype, ops.aten.NAME, ...)
  .NAME            any other name after a dot: attributes, methods (x.forward(...),
                   and the tensor methods, which are operations too)
"""

import argparse
import copy
import os
import re
import string
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "src", "io", "op_allowlist.inc")

# Code is read as words, dots and everything else, with no notion of strings or comments:
# a name inside a string literal or a comment is read like code, so the check never
# depends on agreeing with TorchScript's lexer about where a string ends.
# A number keeps a dot that ends it ("2." before a line break is a float, not an
# attribute access); a dot before a letter is always read as an attribute access.
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9][A-Za-z0-9_]*(?:\.(?![A-Za-z_]))?|[ \t\r\n\f\v\\]+|.", re.S)
# Class names TorchScript makes up (numbered per export): accepted without a list entry.
MANGLED = re.compile(r"___torch_mangle_[0-9]+")
WORD_START = set(string.ascii_letters + "_")
# getattr/hasattr name an attribute by a string: only the exports' form (a module list
# index, getattr(blocks, "0")) is accepted.
GETATTR = re.compile(r"(?<![A-Za-z0-9_])(?:getattr|hasattr)(?![A-Za-z0-9_])")
GETATTR_INDEX = re.compile(r"(?:getattr|hasattr)[ \t]*\([ \t]*[A-Za-z_][A-Za-z0-9_]*[ \t]*,[ \t]*\"[0-9]+\"[ \t]*\)")

# Operations that reach files, and LibTorch's custom C++ classes: a list holding one of
# these means the reading of code went wrong, so none is ever written.
NEVER = {"torch.from_file", "torch.save", "torch.load", "ops.aten.from_file", "ops.aten.save", ".from_file",
         ".save", ".load", ".classes"}


def chains(text):
    """(head, [names after dots]) for every dotted chain; head None when the first dot
    follows something other than a word (a bracket, a quote, a number)."""
    out, chain, after_dot, last_word = [], None, False, False
    for m in TOKEN.finditer(text):
        t = m.group(0)
        if t[0] in " \t\r\n\f\v\\":
            continue
        if t[0] in WORD_START:
            if after_dot:
                if chain is None:
                    chain = (None, [])
                    out.append(chain)
                chain[1].append(t)
            else:
                chain = (t, [])
                out.append(chain)
            after_dot, last_word = False, True
        elif t == ".":
            if not last_word:
                chain = None
            after_dot, last_word = True, False
        else:
            chain, after_dot, last_word = None, False, False
    return out


def names_in_code(text):
    """(names, refused): the listed kinds of names in TorchScript source, and the
    constructs refused whatever the list says (torch or ops used as a value, getattr
    with a name string)."""
    names, refused = set(), set()
    for head, rest in chains(text):
        written = ".".join([head or ""] + rest)
        if head == "torch":
            while rest and rest[0] == "autograd":  # torch.autograd.X is aten::X too
                rest = rest[1:]
            if not rest:
                refused.add(written)
                continue
            names.add("torch." + rest[0])
            rest = rest[1:]
        elif head == "ops":
            if len(rest) < 2:
                refused.add(written)
                continue
            names.add("ops." + rest[0] + "." + rest[1])
            rest = rest[2:]
        # Every other name after a dot is listed too, __torch__ paths included: the
        # archive's own classes (__torch__.sd_modules.UNetModel), where LibTorch's custom
        # C++ classes (__torch__.torch.classes.*) are never listed.
        names.update("." + n for n in rest if not MANGLED.fullmatch(n))
    for m in GETATTR.finditer(text):
        if not GETATTR_INDEX.match(text, m.start()):
            refused.add(text[m.start():m.start() + 40].split("\n")[0])
    return names, refused


def code_records(pt_path):
    """The code/ records of a TorchScript archive (the .debug_pkl source maps left out)."""
    with zipfile.ZipFile(pt_path) as z:
        for name in z.namelist():
            inner = name.split("/", 1)[1] if "/" in name else name
            if inner.lower().startswith("code/") and not inner.lower().endswith(".debug_pkl"):
                yield name, z.read(name).decode("utf-8")


def names_in_archive(pt_path):
    names, refused = set(), set()
    for _, text in code_records(pt_path):
        n, r = names_in_code(text)
        names |= n
        refused |= r
    return names, refused


def variants():
    """(name, LDM config path or dict, text config path, more export arguments) for every
    kind of module the export writes."""
    import yaml
    tiny = os.path.join(REPO, "tests", "fixtures", "tiny")
    tiny2 = os.path.join(REPO, "tests", "fixtures", "tiny2")
    demo = os.path.join(REPO, "models", "demo")
    out = [
        ("sd1-tiny", os.path.join(tiny, "v1-tiny.yaml"), os.path.join(tiny, "text_encoder.json"), []),
        ("sd2-tiny", os.path.join(tiny2, "v2-tiny-v.yaml"), os.path.join(tiny2, "text_encoder.json"), []),
        ("demo", os.path.join(demo, "v1-demo.yaml"), os.path.join(demo, "text_encoder.json"), []),
    ]
    # Full-size layouts (levels, blocks, attention levels) at small widths; each with the
    # other projection type, one with depth 2 and attention in the VAE decoder levels.
    full = dict(model_channels=32, attention_resolutions=[4, 2, 1], num_res_blocks=2, channel_mult=[1, 2, 4, 4])
    vae = dict(ch=32, ch_mult=[1, 2, 4, 4], num_res_blocks=2)
    with open(os.path.join(tiny, "v1-tiny.yaml")) as f:
        sd1 = yaml.safe_load(f)
    p = sd1["model"]["params"]
    p["unet_config"]["params"].update(full, num_heads=8, use_linear_in_transformer=True, transformer_depth=2)
    p["first_stage_config"]["params"]["ddconfig"].update(vae, attn_resolutions=[16])
    out.append(("sd1-full-layout", sd1, os.path.join(tiny, "text_encoder.json"), ["--dtype", "float16"]))
    with open(os.path.join(tiny2, "v2-tiny-v.yaml")) as f:
        sd2 = yaml.safe_load(f)
    p = sd2["model"]["params"]
    p["unet_config"]["params"].update(full, num_head_channels=16, use_linear_in_transformer=False)
    p["first_stage_config"]["params"]["ddconfig"].update(vae)
    out.append(("sd2-full-layout", sd2, os.path.join(tiny2, "text_encoder.json"), []))
    # SDXL: two text encoders (the second with its pooled output), the UNet's vector input.
    xl = os.path.join(REPO, "tests", "fixtures", "sdxl-tiny")
    out.append(("sdxl-tiny", os.path.join(xl, "sd_xl_base_tiny.yaml"), os.path.join(xl, "clip_l_tiny.json"),
                ["--text-config-2", os.path.join(xl, "openclip-bigG-tiny.json")]))
    return out


def collect(log=None):
    """Exports every variant into a temporary folder; returns ({name: [variants]}, refused)."""
    import yaml
    import python_path  # noqa: F401  (makes python/sd_export importable)
    from sd_export.cli import main as export_main
    found, refused = {}, set()
    with tempfile.TemporaryDirectory(prefix="op-allowlist-") as tmp:
        for name, config, text, extra in variants():
            if isinstance(config, dict):
                path = os.path.join(tmp, name + ".yaml")
                with open(path, "w") as f:
                    yaml.safe_dump(copy.deepcopy(config), f)
                config = path
            out = os.path.join(tmp, name)
            if export_main(["--random-init", "--out", out, "--config", config, "--text-config", text, *extra]):
                raise SystemExit(f"gen_op_allowlist.py: error: exporting {name} failed")
            for stage in ("text_encoder", "text_encoder_2", "unet", "vae_decoder", "vae_encoder"):
                if not os.path.exists(os.path.join(out, stage + ".pt")):
                    continue
                names, bad = names_in_archive(os.path.join(out, stage + ".pt"))
                refused |= {f"{name}/{stage}: {b}" for b in bad}
                for n in names:
                    found.setdefault(n, []).append(f"{name}/{stage}")
            if log:
                log(f"  {name}: {len(found)} names so far")
    return found, refused


def render(names):
    import torch
    lines = [
        "// Generated by scripts/gen_op_allowlist.py: do not edit. Every operation, attribute and",
        "// method name in the TorchScript code of this tool's exports (torch "
        + torch.__version__.split("+")[0] + "),",
        "// as src/io/code_check.cpp reads code; a model file whose code names anything else is refused.",
    ]
    lines += [f'"{n}",' for n in sorted(names)]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="gen_op_allowlist.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="file to write (default src/io/op_allowlist.inc)")
    p.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = p.parse_args(argv)
    found, refused = collect(log=lambda m: print(m, file=sys.stderr))
    refused |= {f"{n} (a name never to be listed)" for n in found.keys() & NEVER}
    if refused:
        print("gen_op_allowlist.py: error: the export's own code uses refused constructs: "
              + "; ".join(sorted(refused)), file=sys.stderr)
        return 1
    text = render(found)
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                same = f.read() == text
        except OSError:
            same = False
        print(f"gen_op_allowlist.py: {args.out} is {'up to date' if same else 'out of date'} "
              f"({len(found)} names)", file=sys.stderr)
        return 0 if same else 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"gen_op_allowlist.py: wrote {len(found)} names to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
