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
# Train the same model for 60 steps on the bundled text (byte tokens),
# with a checkpoint at the end.
"$B/dlopt-compile" out/gpt-tiny.mlir --train --optimizer adamw --lr 3e-3 \
  --schedule cosine --warmup-steps 5 --total-steps 60 -o out/gpt-tiny-train.plan
"$B/dlopt-run" out/gpt-tiny-train.plan --steps 60 --data examples/data/corpus.npy \
  --log-every 10 --metrics out/metrics.jsonl --checkpoint-dir out/ckpt
# Apply a plan for 4 CPU devices (dp=2 x tp=2: Megatron tensor parallelism
# over pairs of ranks), check it against one device for 3 steps, and run its
# 4 ranks as threads on the bundled batch (docs/parallel.md).
"$B/dlopt-compile" out/gpt-tiny.mlir --train --optimizer adamw --cluster cpu:2 \
  --fix dp=2,tp=2 --verify-plan -o out/gpt-tiny-dp2tp2.exe | tail -1
"$B/dlopt-run" out/gpt-tiny-dp2tp2.exe --input tokens=examples/data/tokens.npy \
  --input labels=examples/data/labels.npy --seed 0 --output-dir out/dp2tp2
# Plan a GPT-3 1.3B training step for one DGX H100 node: placement,
# predicted step time and memory (docs/plan-report.md).
"$B/dlopt-gen" gpt3-1.3b -q -o out/gpt3-1.3b.mlir
"$B/dlopt-compile" out/gpt3-1.3b.mlir --train --precision bf16 --dry-run \
  --cluster dgx-h100:1 --global-batch 256
