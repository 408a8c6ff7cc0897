#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a passing test suite:
# installs packages, builds, runs every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure -j2 "$@"
