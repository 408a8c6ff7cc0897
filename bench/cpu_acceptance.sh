#!/usr/bin/env bash
# The acceptance runs of issues 34 and 37 in one go, for a quiet machine: steps against the same-run
# bound (fp32, bf16), LCM 4 + TAESD and the Turbo-sized 1 step from process start to PNG, the no-AMX and
# AVX2 stand-ins, peak memory under the documented budgets, and q8 against fp32.
# SD15_DIR: scripts/export_model.py --random-init --out SD15_DIR
# SD21_DIR: scripts/export_model.py --random-init --config bench/v2-inference.yaml --out SD21_DIR
# SD21_BF16_DIR (optional, for the Turbo-sized bf16 runs; default SD21_DIR): the same with --dtype bfloat16
# (mapped as it is by --precision bf16: no narrowing at load)
# SD15_BF16_DIR (optional): SD15_DIR's model exported with --dtype bfloat16; LCM's bf16 runs then also run from it
# Usage (from the repository root): bench/cpu_acceptance.sh SD15_DIR SD21_DIR [SD21_BF16_DIR [SD15_BF16_DIR]]
set -u
U="usage: bench/cpu_acceptance.sh SD15_DIR SD21_DIR [SD21_BF16_DIR [SD15_BF16_DIR]]"
M=${1:?$U}; M2=${2:?$U}; M2B=${3:-$M2}; MB=${4:-}; B=${SD_TXT2IMG:-build/sd-txt2img}
T=tests/fixtures/taesd/taesd_decoder.pth
P='a photograph of an astronaut riding a horse'
export OMP_WAIT_POLICY=passive
O=$(mktemp -d)
lscpu | grep -E 'Model name|CPU family|^Model:'
grep -o 'avx512_bf16\|amx_bf16\|amx_int8\|avx512_vnni\|avx512f \|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
t() { echo "== $* (load $(cut -d' ' -f1-3 /proc/loadavg))"; /usr/bin/time -f "wall %e s, user %U, sys %S, maxrss %M KiB" "$@" 2>&1 | grep -E -i "step [0-9]+/|timing|peak|wall |error|refus|sd-txt2img: .*(bf16|cannot)" | grep -v "peak: predicted\|predicted peak\|: weights " | tail -20; }
echo "### fp32 and bf16 steps against the same-run bound"
bench/bench_speed.sh --model "$M" --sizes 256 512 --steps 4 --runs 3 --profile-size 0 --profile-vae-size 0 --json "$O"/fp32.json 2>&1 | grep -v "^\[bench\]   "
bench/bench_speed.sh --model "$M" --sizes 512 --steps 4 --runs 3 --profile-size 0 --profile-vae-size 0 --cli-args "--precision bf16" --label bf16 --json "$O"/bf16.json 2>&1 | grep -v "^\[bench\]   "
echo "### LCM 4 + TAESD 512, process start to PNG, alternating"
for _ in 1 2 3; do
  for p in fp32 bf16 ${MB:+bf16-export}; do
    m=$M; [ $p = bf16-export ] && m=$MB && p=bf16
    t "$B" --model "$m" --prompt "$P" --seed 1 --H 512 --W 512 --threads 2 --verbose --sampler lcm --steps 4 --scale 1 --vae-decoder "taesd:$T" --precision $p --outdir "$O"/lcm
  done
done
echo "### Turbo-sized (SD 2.1 base UNet) 1 step + TAESD 512, bf16 (from $M2B) and fp32 (from $M2)"
for _ in 1 2 3; do
  for p in bf16 fp32; do m=$M2; [ $p = bf16 ] && m=$M2B; t "$B" --model "$m" --prompt "$P" --seed 1 --H 512 --W 512 --threads 2 --verbose --sampler euler_a --schedule trailing --steps 1 --scale 1 --vae-decoder "taesd:$T" --precision $p --outdir "$O"/turbo; done
done
echo "### stand-ins: no AMX (AVX512_CORE_BF16) bf16 and fp32; AVX2 fp32"
echo "per-core instruction peaks (fp32 FMA against avx512_bf16's dot product; cmake --build build --target bench_isa_peak)"
[ -x build/bench_isa_peak ] && build/bench_isa_peak 2
DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 bench/bench_speed.sh --model "$M" --sizes 512 --no-cli --profile-size 0 --profile-vae-size 0 2>&1 | grep -E "^fp32 bound|^bf16 peak"
for p in fp32 bf16; do DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 t "$B" --model "$M" --prompt "$P" --H 512 --W 512 --steps 4 --sampler ddim --threads 2 --verbose --precision $p --outdir "$O"/isa; done
SD_ATTENTION_ISA=avx2 SD_BLOCKED_ISA=avx2 DNNL_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell t "$B" --model "$M" --prompt "$P" --H 512 --W 512 --steps 4 --sampler ddim --threads 2 --verbose --outdir "$O"/isa
SD_ATTENTION_ISA=avx2 SD_BLOCKED_ISA=avx2 DNNL_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell t "$B" --model "$M" --prompt "$P" --H 256 --W 256 --steps 4 --sampler ddim --threads 2 --verbose --outdir "$O"/isa
echo "### memory at 512 (no --verbose: it resets the peak per stage, so /usr/bin/time would see the last stage only)"
t "$B" --model "$M" --prompt "$P" --H 512 --W 512 --steps 2 --sampler ddim --threads 2 --max-memory 3.5G --outdir "$O"/mem
t "$B" --model "$M" --prompt "$P" --H 512 --W 512 --steps 2 --sampler ddim --threads 2 --weights fp16 --max-memory 2.3G --outdir "$O"/mem
t "$B" --model "$M" --prompt "$P" --H 512 --W 512 --steps 2 --sampler ddim --threads 2 --precision bf16 --max-memory 2.3G --outdir "$O"/mem
t "$B" --model "$M" --prompt "$P" --H 512 --W 512 --steps 2 --sampler ddim --threads 2 --weights q8 --max-memory 1.5G --outdir "$O"/mem
echo "### q8 vs fp32 step 512, alternating"
for _ in 1 2; do for w in fp32 q8; do t "$B" --model "$M" --prompt "$P" --H 512 --W 512 --steps 4 --sampler ddim --threads 2 --verbose --weights $w --outdir "$O"/q8; done; done
uptime
