#!/usr/bin/env bash
# Configures and builds into ./build (Release). Also exports the demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
