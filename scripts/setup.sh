#!/usr/bin/env bash
# Installs the Debian 12 packages sd-txt2img needs to build, test and export
# models. Safe to run again: it installs only what is missing.
set -euo pipefail

packages=(
  build-essential cmake
  libtorch-dev            # LibTorch 1.13 (CPU): runs the TorchScript stages
  libdnnl-dev             # oneDNN (the one LibTorch links): the Linear layers, 3x OpenBLAS's speed here
  libopenblas0-pthread    # without it LibTorch's matmuls use the reference BLAS, ~50x slower
  libcli11-dev            # command-line flags
  libstb-dev              # stb_image_write: PNG output
  nlohmann-json3-dev      # model.json, vocab.json, JSON lines
  zlib1g-dev              # deflated records of torch.save archives (src/io/zip_reader.cpp)
  libicu-dev              # Unicode for the CLIP tokenizer (NFC, categories, lower-case)
  libgtest-dev            # tests
  clang-format            # scripts/check_format.sh: the C++ style of .clang-format
  python3-torch python3-numpy python3-yaml   # scripts/export_model.py
  python3-pil             # tests read PNG metadata with an independent reader
  parallel                # GNU parallel: the test of sharding with parallel --joblog --resume (docs/cluster.md)
  slurmctld slurmd slurm-client munge   # the test's one-node Slurm cluster (tests/cluster, docs/cluster.md)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present" >&2
fi
