#!/usr/bin/env bash
# Fresh-machine quick start: install dependencies, build, then compile and run
# the bundled tiny GPT (examples/gpt-tiny.mlir) on the bundled token batch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
B=${BUILD_DIR:-build}/bin
mkdir -p out
set -x
"$B/dlopt-gen" gpt --preset gpt-tiny -o out/gpt-tiny.mlir
"$B/dlopt-compile" out/gpt-tiny.mlir -o out/gpt-tiny.plan
"$B/dlopt-run" out/gpt-tiny.plan --input tokens=examples/data/tokens.npy \
  --input labels=examples/data/labels.npy --seed 0 --output-dir out
