#!/usr/bin/env bash
# Memory benchmark: whole-run peak RSS (/usr/bin/time -v) against the planner's
# prediction (--plan) on a model folder, for each configuration given as
#   SIZE IMAGES ATTENTION BUDGET SAMPLER STEPS
# lines on stdin (ATTENTION may be auto; BUDGET may be "-" for none).
# Prints a Markdown table row per run (a plan the tool refuses gets its message).
# Usage: scripts/bench_memory.sh MODEL_DIR < configs.txt
# SD_EXTRA_ARGS adds flags to every run (e.g. "--weights fp16" or "--scale 1").
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?model folder}
bin=${SD_TXT2IMG:-build/sd-txt2img}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| size | images | attention | budget | sampler, steps | plan | predicted peak | measured peak | s/step |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
while read -r size images attention budget sampler steps; do
  [ -z "$size" ] && continue
  args=(--model "$model" --prompt "a photograph of an astronaut riding a horse" --H "$size" --W "$size"
        --n_samples "$images" --attention "$attention" --sampler "$sampler" --steps "$steps" --threads 2)
  # shellcheck disable=SC2206  # word splitting wanted: several flags in one variable
  extra=(${SD_EXTRA_ARGS:-})
  args+=("${extra[@]}")
  [ "$budget" != "-" ] && args+=(--max-memory "$budget")
  if ! plan=$("$bin" "${args[@]}" --plan 2>&1); then  # refused up front: the row says why
    printf '| %s² | %s | %s | %s | %s %s | %s | | not run | |\n' "$size" "$images" "$attention" "$budget" \
      "$sampler" "$steps" "${plan#sd-txt2img: error: }"
    continue
  fi
  predicted=$(sed -n 's/.*predicted peak: //p' <<<"$plan")
  choice=$(sed -n 's/^  attention: //p' <<<"$plan")
  seq=$(grep -q "sequential (one" <<<"$plan" && echo "sequential" || echo "resident")
  /usr/bin/time -v "$bin" "${args[@]}" --outdir "$out" > /dev/null 2> "$out/err"
  kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$out/err")
  sps=$(grep -o '[0-9.]* s/step' "$out/err" | tail -1)
  printf '| %s² | %s | %s | %s | %s %s | %s; %s | %s | %.2f GiB | %s |\n' "$size" "$images" "$attention" "$budget" \
    "$sampler" "$steps" "$seq" "$choice" "$predicted" "$(echo "$kib / 1048576" | bc -l)" "$sps"
done
