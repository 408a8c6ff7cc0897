#!/usr/bin/env bash
# SDXL benchmark (issue 20): the full-size SDXL base architecture with random
# weights (speed and memory do not depend on the values), exported from the
# sgm layout, 2 threads. Prints Markdown for docs/benchmarks.md:
#   1024x1024 with --weights fp16 under --max-memory 7G and fp32 under 12G
#   (peak RSS by /usr/bin/time -v against the planner's prediction),
#   the Turbo recipe at 512x512 with 1 and 4 steps (seconds per image),
#   and s/step at 1024x1024 against the arithmetic bound (bench_speed.py).
# Usage: bench/bench_sdxl.sh [WORKDIR]   (default /tmp/sdxl-bench; the two
# exports take about 15 GB of disk; about 30 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/sdxl-bench}
bin=${SD_TXT2IMG:-build/sd-txt2img}
export PYTHONPATH=python
prompt="a photograph of an astronaut riding a horse"
for dtype in float32 float16; do
  if [ ! -f "$work/$dtype/model.json" ]; then
    /usr/bin/time -f "export $dtype: %e s wall, peak RSS %M KiB" /usr/bin/python3 scripts/export_model.py \
      --random-init --config bench/sd_xl_base.yaml --dtype "$dtype" --out "$work/$dtype" >&2
  fi
done
echo "Machine: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) vCPUs; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Memory, 1024x1024, Euler 2 steps, guided (scripts/bench_memory.sh):"
echo
SD_EXTRA_ARGS="--weights fp16" scripts/bench_memory.sh "$work/float16" <<< "1024 1 auto 7G euler 2" | sed 's/^| 1024/| fp16 weights, 1024/'
scripts/bench_memory.sh "$work/float32" <<< "1024 1 auto 12G euler 2" | tail -1 | sed 's/^| 1024/| fp32, 1024/'
echo
echo "Turbo recipe at 512x512 (euler_a, trailing, scale 1), seconds per image end to end:"
echo
echo "| weights | steps | seconds | predicted peak | measured peak |"
echo "| --- | --- | --- | --- | --- |"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for steps in 1 4; do
  args=(--model "$work/float32" --prompt "$prompt" --H 512 --W 512 --sampler euler_a --schedule trailing --scale 1
        --steps "$steps" --threads 2 --seed 1)
  predicted=$("$bin" "${args[@]}" --plan 2>&1 | sed -n 's/.*predicted peak: //p')
  start=$(date +%s.%N)
  /usr/bin/time -v "$bin" "${args[@]}" --outdir "$out" > /dev/null 2> "$out/err"
  end=$(date +%s.%N)
  kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$out/err")
  printf '| fp32 | %s | %.1f | %s | %.2f GiB |\n' "$steps" "$(echo "$end - $start" | bc -l)" "$predicted" \
    "$(echo "$kib / 1048576" | bc -l)"
done
echo
echo "Load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
/usr/bin/python3 bench/bench_speed.py --model "$work/float32" --sizes 1024 --steps 2 --threads 2 --profile-size 0
