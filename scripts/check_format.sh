#!/usr/bin/env bash
# Fails (exit 1), naming each file, when C++ under src/, apps/ or include/ is
# not as .clang-format writes it. scripts/test.sh runs it before building.
#   scripts/check_format.sh          check
#   scripts/check_format.sh --fix    reformat those files in place
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$fmt" ]; then
  echo "check_format: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files -- 'src/*.cpp' 'src/*.h' 'apps/*.cpp' 'apps/*.h' 'include/*.h')
if [ "${1:-}" = "--fix" ]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$fmt" "$f" | cmp -s - "$f"; then
    echo "check_format: $f is not formatted (scripts/check_format.sh --fix)" >&2
    bad=1
  fi
done
[ "$bad" -eq 0 ] && echo "check_format: ${#files[@]} files formatted" >&2
exit "$bad"
