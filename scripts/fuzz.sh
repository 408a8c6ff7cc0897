#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, clang-14, ASan + UBSan) into
# ./build-fuzz and runs each for SECONDS (default 600), one after another.
#   scripts/fuzz.sh [SECONDS] [HARNESS...]     harnesses: weight_index model_config
#                                              prompts prompt_weights tokenizer png_text
#                                              torch_pickle lora_file image_reader
# Each run starts from the committed seeds (tests/fuzz/corpus/<harness>) and the
# inputs earlier runs kept (build-fuzz/corpus/<harness>); a crashing input is
# written to build-fuzz/crashes/<harness>/ and the run ends with status 1.
# The full log of each run is build-fuzz/logs/<harness>.log. Docs: docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/.."

all=(weight_index model_config prompts prompt_weights tokenizer png_text torch_pickle lora_file image_reader)
seconds=600
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then seconds=$1; shift; fi
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=("${all[@]}")
for h in "${harnesses[@]}"; do
  [[ " ${all[*]} " == *" $h "* ]] || { echo "fuzz: unknown harness '$h' (known: ${all[*]})" >&2; exit 2; }
done

# clang-14 and its libFuzzer runtime; not part of scripts/setup.sh, since the
# default build and tests do not need them.
need=()
command -v clang++-14 >/dev/null || need+=(clang-14)
ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "fuzz: installing ${need[*]} (clang-14 and its libFuzzer runtime)" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" ||
    { echo "fuzz: could not install ${need[*]}; install them (Debian 12) and run again" >&2; exit 2; }
fi

# -O1 with assertions on (Debug keeps NDEBUG off, so library asserts fire too).
cmake -S . -B build-fuzz -DSD_FUZZ=ON -DBUILD_TESTING=OFF -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target $(printf 'fuzz_%s ' "${harnesses[@]}")

echo "fuzz: $seconds s per harness on $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%dT%H:%MZ)"
status=0
for h in "${harnesses[@]}"; do
  corpus=build-fuzz/corpus/$h crashes=build-fuzz/crashes/$h log=build-fuzz/logs/$h.log
  mkdir -p "$corpus" "$crashes" build-fuzz/logs
  dict=()
  [ -f "tests/fuzz/$h.dict" ] && dict=(-dict="tests/fuzz/$h.dict")
  # Not -jobs/-fork: one process, niced, so that a core stays free for others.
  # A single input may take 10 s and 2 GB at most before it counts as a finding.
  set +e
  nice -n 10 "build-fuzz/tests/fuzz/fuzz_$h" -max_total_time="$seconds" -print_final_stats=1 \
    -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$crashes/" "${dict[@]}" \
    "$corpus" "tests/fuzz/corpus/$h" >"$log" 2>&1
  rc=$?
  set -e
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  echo "fuzz: $h: exit $rc, $execs executions, $rate exec/s, corpus $(ls "$corpus" | wc -l) files"
  echo "      $last"
  if [ $rc -ne 0 ] || [ -n "$(ls -A "$crashes")" ]; then
    status=1
    echo "fuzz: $h FOUND something: see $log and the inputs in $crashes/" >&2
    grep -E 'ERROR: |runtime error|terminate called|what\(\)' "$log" | head -5 >&2 || true
  fi
done
exit $status
