#!/usr/bin/env bash
# Speed benchmark (issue 6): thin wrapper that runs bench/bench_speed.py with
# Debian's Python, which has python3-torch (the first python3 on PATH may not), and
# the export package (python/sd_export) on its path.
# Usage: bench/bench_speed.sh --model DIR [--sizes 256 512] [--steps 5] [--threads 2] [--write-docs] ...
# SD_TXT2IMG=path/to/sd-txt2img picks the binary (default build/sd-txt2img).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-/usr/bin/python3}
# As the CLI does (include/sd/engine.h): Debian's OpenBLAS falls back to its SSE3 kernels on CPU
# models it does not know, which would make its torch.mm peak (one side of the bound) too low.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q ' avx512f ' /proc/cpuinfo && grep -q ' avx512bw ' /proc/cpuinfo &&
  grep -q ' avx512dq ' /proc/cpuinfo && grep -q ' avx512vl ' /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SKYLAKEX
fi
bin_args=()
[ -n "${SD_TXT2IMG:-}" ] && bin_args=(--bin "$SD_TXT2IMG")
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" exec "$py" bench/bench_speed.py "${bin_args[@]}" "$@"
