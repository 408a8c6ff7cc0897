#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to an image: installs packages,
# builds, exports the built-in demo model and generates one image with it.
# Usage: scripts/quickstart.sh ["prompt"] [more sd-txt2img flags]
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the image's path goes to stdout: everything the set-up and build print goes to stderr.
scripts/setup.sh >&2
# The tool and the demo model only: the tests are for scripts/test.sh.
scripts/build.sh sd-txt2img demo-model >&2
prompt="${1:-a red circle on a blue background}"
shift || true
build/sd-txt2img --prompt "$prompt" --outdir outputs/quickstart "$@"
