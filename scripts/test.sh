#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a passing test suite:
# installs packages, builds, runs every test with CTest.
#   scripts/test.sh [CTEST ARGS...]             everything, in ./build
#   scripts/test.sh --sanitize [CTEST ARGS...]  the unit tests (ctest -L unit) built with
#                                               AddressSanitizer + UBSan, in ./build-sanitize
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  shift
  scripts/setup.sh
  # -O1 with assertions on; no LibTorch engine (see SD_SANITIZE in CMakeLists.txt).
  cmake -S . -B build-sanitize -DSD_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" >/dev/null
  cmake --build build-sanitize -j"$(nproc)"
  cd build-sanitize
  # Every report fails its test (the build sets -fno-sanitize-recover); leaks
  # are reported too, and stack use after return and init-order bugs checked.
  export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  exec ctest -L unit --output-on-failure -j2 "$@"
fi
scripts/setup.sh
scripts/check_format.sh
scripts/build.sh
cd build
ctest --output-on-failure -j2 "$@"
