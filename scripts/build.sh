#!/usr/bin/env bash
# Configures and builds into ./build (Release). Also exports the demo model.
#   scripts/build.sh            everything: the tool, the demo model, the tests
#   scripts/build.sh TARGET...  only these CMake targets (and what they need)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
if [ $# -eq 0 ]; then
  cmake --build build -j"$(nproc)"
else
  for target in "$@"; do cmake --build build -j"$(nproc)" --target "$target"; done
fi
