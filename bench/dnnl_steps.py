#!/usr/bin/python3
"""oneDNN's time per sampler step, by primitive and implementation, from a DNNL_VERBOSE=1 CLI log.

The CLI's progress lines ("step N/M") split the log: the first part holds loading, prompt
encoding and the first UNet call, each later part one UNet call, the last one the decode too.

    DNNL_VERBOSE=1 build/sd-txt2img --model SD15 --prompt "a photograph" --H 512 --W 512 \\
        --sampler lcm --steps 3 --scale 1 --threads 2 > LOG 2>&1
    /usr/bin/python3 bench/dnnl_steps.py LOG
"""
import collections
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    parts, current = [], []
    with open(sys.argv[1], errors="replace") as log:
        for line in log:
            if line.startswith("sd-txt2img:") and " step " in line:
                parts.append(current)
                current = []
            elif line.startswith("onednn_verbose,exec,"):
                current.append(line.rstrip("\n").split(","))
    parts.append(current)
    for i, part in enumerate(parts):
        ms, calls = collections.Counter(), collections.Counter()
        for f in part:
            key = f"{f[3]} {f[4]}"  # primitive, implementation
            ms[key] += float(f[-1])
            calls[key] += 1
        label = "loading, prompts, step 1" if i == 0 else f"after step {i}: the next step, or the decode"
        print(f"part {i} ({label}): {sum(ms.values()):.0f} ms in oneDNN")
        for key, total in ms.most_common(8):
            print(f"  {total:9.1f} ms {calls[key]:5d} calls  {key}")


if __name__ == "__main__":
    main()
