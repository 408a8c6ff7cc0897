#!/usr/bin/env bash
# Acceptance (issue 36): on a real one-node Slurm cluster, `sbatch --array=0-3
# --wait` of tests/cluster/shards.sbatch gives exactly the images of one
# unsharded run, byte for byte; an array cancelled midway and submitted again
# completes the set. Usage: slurm_array_test.sh SD_TXT2IMG MODEL_DIR
# Exit 77 (skipped) only where the daemons cannot start.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export SD_TXT2IMG="$1" SD_MODEL="$2"
export SD_FLAGS="--threads 1 --H 64 --W 64 --steps 4"
work="$(mktemp -d /tmp/sd-slurm.XXXXXX)"
cluster="$work/cluster"
mkdir -p "$cluster"
finish() { "$here/one_node_slurm.sh" stop "$cluster" || true; rm -rf "$work"; }
trap finish EXIT
"$here/one_node_slurm.sh" start "$cluster"
export SLURM_CONF="$cluster/slurm.conf"
echo "cluster: $(sinfo --version), $(munged --version 2>&1 | head -1)"

fail() { echo "FAIL: $*" >&2; exit 1; }
pngs() { (cd "$1" && find . -name '*.png' -not -path './previews/*' | sort); }
same_pngs() {  # same names, same bytes
  [ "$(pngs "$1")" = "$(pngs "$2")" ] || fail "$2 has other images than $1: $(diff <(pngs "$1") <(pngs "$2") | head -5 | tr '\n' ' ')"
  for f in $(pngs "$1"); do cmp -s "$1/$f" "$2/$f" || fail "$2/$f differs from the unsharded run's"; done
}
written_once() {  # every image of the reference is written exactly once in the manifests
  local want got
  want="$(pngs "$1" | wc -l)"
  got="$(cat "$2"/manifest-*.jsonl | /usr/bin/python3 -c '
import json, sys, collections
c = collections.Counter(json.loads(l)["index"] for l in sys.stdin if json.loads(l)["status"] == "written")
assert all(v == 1 for v in c.values()), c
print(len(c))')" || fail "an image was written twice: $got"
  [ "$got" = "$want" ] || fail "the manifests list $got images, the unsharded run made $want"
}
# Keep the test's batch script the one docs/cluster.md shows.
grep -qF -- '--shard auto --skip-existing --outdir "$SD_OUT"' "$here/../../docs/cluster.md" ||
  fail "docs/cluster.md does not show tests/cluster/shards.sbatch"

export SD_PROMPTS="$work/prompts.txt"
for i in $(seq 1 24); do echo "a shape number $i on a plain background"; done >"$SD_PROMPTS"

# One unsharded run: the reference.
"$SD_TXT2IMG" --model "$SD_MODEL" --from-file "$SD_PROMPTS" --seed-mode per-image --seed 1000 \
  --outdir "$work/ref" --quiet $SD_FLAGS >/dev/null

# 1. The array in one go.
export SD_OUT="$work/array"
mkdir -p "$SD_OUT"
(cd "$SD_OUT" && sbatch --array=0-3 --wait --parsable "$here/shards.sbatch") >"$work/job1"
job="$(cat "$work/job1")"
for t in 0 1 2 3; do
  scontrol show job "${job}_$t" | grep -E "JobId|JobState|ExitCode" | tr -s ' ' | sed 's/^/  /'
done
same_pngs "$work/ref" "$SD_OUT"
written_once "$work/ref" "$SD_OUT"
echo "array of 4: $(pngs "$SD_OUT" | wc -l) images, byte-identical to the unsharded run"

# 2. Cancelled midway, then submitted again with the same script.
export SD_OUT="$work/resumed"
mkdir -p "$SD_OUT"
job="$(cd "$SD_OUT" && sbatch --array=0-3 --parsable "$here/shards.sbatch")"
for _ in $(seq 600); do [ "$(pngs "$SD_OUT" | wc -l)" -ge 3 ] && break; sleep 0.05; done
scancel "$job"
for _ in $(seq 300); do [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break; sleep 0.1; done
made="$(pngs "$SD_OUT" | wc -l)"
[ "$made" -lt "$(pngs "$work/ref" | wc -l)" ] || fail "the array finished before it could be cancelled"
echo "cancelled after $made images"
(cd "$SD_OUT" && sbatch --array=0-3 --wait --parsable "$here/shards.sbatch") >/dev/null
same_pngs "$work/ref" "$SD_OUT"
written_once "$work/ref" "$SD_OUT"
echo "resubmitted: the set is complete and byte-identical"
