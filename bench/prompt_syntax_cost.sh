#!/usr/bin/env bash
# What A1111's prompt syntax costs a run: a plain prompt, the same with an alternation and an
# edit (more texts encoded, held through sampling) and with AND (one more UNet row an image), on
# one model, alternating, from process start to PNG. Prints each run's step times, text encode
# time, wall time and peak memory (maximum RSS), with the CPU and the load.
# Usage (from the repository root): bench/prompt_syntax_cost.sh MODEL_DIR [SIZE [STEPS [RUNS]]]
#   MODEL_DIR: e.g. scripts/export_model.py --random-init --out MODEL_DIR (full-size SD 1.5)
set -u
M=${1:?usage: bench/prompt_syntax_cost.sh MODEL_DIR [SIZE [STEPS [RUNS]]]}
S=${2:-512}; N=${3:-4}; R=${4:-3}; B=${SD_TXT2IMG:-build/sd-txt2img}
export OMP_WAIT_POLICY=passive
O=$(mktemp -d)
lscpu | grep -E 'Model name|CPU family|^Model:'
grep -o 'avx512_bf16\|amx_bf16\|avx512f \|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
prompts=("a photograph of a cat in a garden"
         "a photograph of a [cat|dog] in a [garden:forest:0.5]"
         "a photograph of a cat in a garden AND a dog:0.5")
for r in $(seq "$R"); do
  for i in 0 1 2; do
    echo "== run $r, prompt $i: ${prompts[$i]} (load $(cut -d' ' -f1-3 /proc/loadavg))"
    /usr/bin/time -f "wall %e s, maxrss %M KiB" "$B" --model "$M" --prompt "${prompts[$i]}" --seed 1 --H "$S" \
      --W "$S" --steps "$N" --sampler ddim --threads 2 --verbose --outdir "$O/$r-$i" 2>&1 |
      grep -E "step $N/$N|timing|wall |error" | sed -e 's/^sd-txt2img: //'
  done
done
rm -rf "$O"
