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
#
# bench/bench_sdxl.sh --budgets MODEL_DIR [PICTURE]   (issues 37 and 33): the small
# budgets at 1024x1024 on one fp16 export (made in MODEL_DIR if it has no model.json;
# 5 GB of disk, peak 7.3 GiB while exporting), one run at a time, in this order:
#   txt2img --weights q8 --max-memory 4.5G, Euler 2 steps;
#   img2img --weights fp16 --max-memory 7G --strength 0.5, Euler 4 steps (2 run);
#   txt2img --weights fp16 --max-memory 7G, Euler 2 steps.
# PICTURE is a 1024x1024 picture (default: a drawing made with PIL). Prints the CPU,
# uptime before each run, and a Markdown row per run: the planner's prediction against
# /usr/bin/time -v's peak RSS, and the last step's seconds. About 20 minutes on 2 quiet cores.
# SDXL_BENCH_LOGS=DIR keeps each run's stderr and picture in DIR; SDXL_BENCH_STAGES=1: see budget_run.
set -euo pipefail
cd "$(dirname "$0")/.."

# One run under /usr/bin/time -v: a Markdown row of the plan's prediction, the peak and the last step's time.
# SDXL_BENCH_STAGES=1 adds --verbose and its per-stage peaks (stderr). --verbose starts each stage's
# peak afresh (/proc/self/clear_refs), which also resets what /usr/bin/time reads at exit, so the
# row's peak is then the largest stage peak, a lower bound (measured 5.73 GiB where a plain run of
# the same img2img took 6.13).
budget_run() {
  local what=$1 err
  shift
  local args=(--prompt "a photograph of an astronaut riding a horse" --H 1024 --W 1024 --sampler euler --threads 2
              --seed 1 "$@")
  local plan predicted choice kib sps peak
  plan=$("$bin" "${args[@]}" --plan 2>&1) || { printf '| %s | refused: %s | | | |\n' "$what" "$plan"; return; }
  predicted=$(sed -n 's/.*predicted peak: //p' <<<"$plan")
  choice=$(sed -n 's/^  attention: //p' <<<"$plan")
  [ "${SDXL_BENCH_STAGES:-0}" = 1 ] && args+=(--verbose)
  echo "uptime before $what: $(uptime)" >&2
  err="$out/err-${what// /-}"
  /usr/bin/time -v "$bin" "${args[@]}" --outdir "$out" > /dev/null 2> "$err" || true
  kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$err")
  [ -n "$kib" ] || { printf '| %s | %s | %s | failed: %s | |\n' "$what" "$choice" "$predicted" "$(tail -1 "$err")"; return; }
  sps=$(grep -o '[0-9.]* s/step' "$err" | tail -1)
  grep -E "peak: predicted|model evaluations|Exit status" "$err" | sed "s/^/$what: /" >&2
  peak=$(printf '%.2f GiB (%s KiB)' "$(echo "$kib / 1048576" | bc -l)" "$kib")
  if [ "${SDXL_BENCH_STAGES:-0}" = 1 ]; then
    peak="$(sed -n 's/.* peak: predicted .*, measured \([0-9.]*\) GiB.*/\1/p' "$err" | sort -g | tail -1) GiB (stages:"
    peak+=" $(sed -n 's/.* peak: predicted .*, measured \([0-9.]* [GM]iB\).*/\1/p' "$err" | paste -sd, -))"
  fi
  printf '| %s | %s | %s | %s | %s |\n' "$what" "$choice" "$predicted" "$peak" "$sps"
}

if [ "${1:-}" = "--budgets" ]; then
  model=${2:?model folder}
  picture=${3:-}
  bin=${SD_TXT2IMG:-build/sd-txt2img}
  export PYTHONPATH=python
  if [ ! -f "$model/model.json" ]; then
    /usr/bin/time -f "export float16: %e s wall, peak RSS %M KiB" /usr/bin/python3 scripts/export_model.py \
      --random-init --config bench/sd_xl_base.yaml --dtype float16 --out "$model" >&2
  fi
  if [ -n "${SDXL_BENCH_LOGS:-}" ]; then  # keep each run's stderr and picture there
    out=$SDXL_BENCH_LOGS
    mkdir -p "$out"
  else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
  fi
  if [ -z "$picture" ]; then
    picture="$out/init-1024.png"
    /usr/bin/python3 -c "
from PIL import Image, ImageDraw
im = Image.new('RGB', (1024, 1024), (120, 170, 220))
d = ImageDraw.Draw(im)
d.rectangle([0, 640, 1023, 1023], fill=(60, 140, 60))
d.ellipse([600, 120, 860, 380], fill=(250, 220, 80))
d.polygon([(150, 640), (400, 260), (650, 640)], fill=(110, 100, 95))
im.save('$picture')"
  fi
  echo "CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), family $(sed -n 's/^cpu family\s*: //p' \
    /proc/cpuinfo | head -1) model $(sed -n 's/^model\s*: //p' /proc/cpuinfo | head -1), $(nproc) vCPUs;" \
    "flags: $(grep -o -w -E 'avx512[a-z_0-9]*|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo
  echo "| run | plan (attention, UNet rows, VAE) | predicted peak | measured peak | last step |"
  echo "| --- | --- | --- | --- | --- |"
  budget_run "q8 txt2img 4.5G" --model "$model" --weights q8 --max-memory 4.5G --steps 2
  budget_run "fp16 img2img 7G" --model "$model" --weights fp16 --max-memory 7G --steps 4 --init-img "$picture" \
    --strength 0.5
  budget_run "fp16 txt2img 7G" --model "$model" --weights fp16 --max-memory 7G --steps 2
  exit 0
fi
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
