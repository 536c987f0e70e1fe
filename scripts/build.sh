#!/usr/bin/env bash
# Configures (once) and builds dlopt into ${BUILD_DIR:-build} with two jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR="$(llvm-config-22 --prefix)/lib/cmake/mlir" "$@"
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-2}"
