#!/usr/bin/env bash
# Installs dlopt's build and test dependencies from Debian 12 packages
# (slurm-wlm and munge: the srun tests start a one-node cluster,
# scripts/local-slurm.sh).
set -euo pipefail
pkgs=(cmake ninja-build g++ git
      libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
      clang-22 libfuzzer-22-dev libclang-rt-22-dev
      libfmt-dev libopenblas-dev libdnnl-dev libgtest-dev libbenchmark-dev
      nlohmann-json3-dev libyaml-cpp-dev coinor-libcbc-dev pkg-config
      libopenmpi-dev openmpi-bin slurm-wlm munge
      python3 python3-numpy python3-psutil)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
