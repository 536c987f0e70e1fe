#!/usr/bin/env bash
# Plan application figures (docs/performance.md, "Applying a plan"):
#   - the time to apply a tp=8 x dp=128 plan to the gpt3-175b training step
#     and write its executable (target: under 20 s on the 2-core dev box),
#     next to compiling the single-device step;
#   - the time to apply a tp=8 x pp=16 x dp=8 interleaved plan (v=2, 32
#     micro-batches) to the same step (target: under 30 s);
#   - executable sizes, parallel against single-device (target: at most 2x);
#   - step times of the tiny gpt: dp, tp, sp, and pp=2 against one device.
# The cluster is 128 nodes of 8 A100s with 2 TB each: the plan is applied as
# pinned, whether or not it fits real A100s (it does not without pp/ZeRO).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/big.yaml" <<'YAML'
name: big-memory
gpus_per_node: 8
intra_node: {topology: nvswitch, bidirectional_bandwidth_gb_s: 600, latency_us: 1}
network: {nics: 8, nic_gbit_s: 200, latency_us: 5}
nodes:
  - count: 128
    gpu: {base: a100-sxm-80gb, memory_gb: 2000}
YAML
now() { date +%s.%N; }
size() { stat -c %s "$1"; }
"$BIN/dlopt-gen" gpt3-175b --batch 128 -q -o "$work/g175.mlir"
t0=$(now)
"$BIN/dlopt-compile" "$work/g175.mlir" --train --precision bf16 --quiet -o "$work/one.exe"
t1=$(now)
"$BIN/dlopt-compile" "$work/g175.mlir" --train --precision bf16 --quiet \
  --cluster "$work/big.yaml" --fix tp=8,dp=128 -o "$work/par.exe"
t2=$(now)
printf 'gpt3-175b training step, bf16, batch 128\n'
printf '  compile, 1 device:              %6.2f s  executable %8d bytes\n' \
  "$(echo "$t1 - $t0" | bc)" "$(size "$work/one.exe")"
printf '  apply tp=8 x dp=128 (1024 ranks): %6.2f s  executable %8d bytes (%.2fx)\n' \
  "$(echo "$t2 - $t1" | bc)" "$(size "$work/par.exe")" \
  "$(echo "$(size "$work/par.exe") / $(size "$work/one.exe")" | bc -l)"
# Pipelined: the model's batch is one micro-batch (8 sequences, one per
# data-parallel replica), 32 of them per step.
"$BIN/dlopt-gen" gpt3-175b --batch 8 -q -o "$work/g175mb.mlir"
t3=$(now)
"$BIN/dlopt-compile" "$work/g175mb.mlir" --train --precision bf16 --quiet \
  --cluster "$work/big.yaml" --fix tp=8,pp=16,dp=8,schedule=interleaved,v=2 \
  --accumulate 32 -o "$work/pp.exe"
t4=$(now)
printf '  apply tp=8 x pp=16 x dp=8, interleaved v=2, 32 micro-batches: %6.2f s  executable %8d bytes\n' \
  "$(echo "$t4 - $t3" | bc)" "$(size "$work/pp.exe")"
rm -f "$work/pp.exe"
"$BIN/dlopt-gen" gpt-tiny --batch 8 -q -o "$work/tiny.mlir"
"$BIN/dlopt-compile" "$work/tiny.mlir" --train --quiet -o "$work/tiny1.exe"
printf 'gpt-tiny training step, f32, batch 8: 1 device %d bytes\n' "$(size "$work/tiny1.exe")"
for fix in dp=2:cpu dp=8:cpu:4 tp=2,dp=1:cpu dp=2,tp=4:cpu:4 dp=2,tp=2,sp=1:cpu:2; do
  f=${fix%%:*}; c=${fix#*:}
  "$BIN/dlopt-compile" "$work/tiny.mlir" --train --quiet --cluster "$c" --fix "$f" -o "$work/t.exe"
  printf '  %-16s %8d bytes (%.2fx)\n' "$f" "$(size "$work/t.exe")" \
    "$(echo "$(size "$work/t.exe") / $(size "$work/tiny1.exe")" | bc -l)"
done
# In-process all-reduce of 64 MiB over 4 ranks against memcpy.
"$BIN/dlopt-bench-comm" 64 4 5
# Step time of a dp=2 (and dp=2 x tp=2) tiny-gpt training step against one
# device: median over 30 SGD steps on the bundled corpus, ranks as threads.
"$BIN/dlopt-gen" gpt-tiny --batch 8 -q -o "$work/g8.mlir"
median() { python3 -c "import json,sys,statistics; print('%.3f' % (1e3*statistics.median(json.loads(l)['step_time_s'] for l in open(sys.argv[1]))))" "$1"; }
printf 'gpt-tiny training step (batch 8, SGD), median of 30 steps:\n'
for fix in none dp=2:cpu dp=2,tp=2:cpu:2 dp=2,tp=2,sp=1:cpu:2; do
  if [ "$fix" = none ]; then
    "$BIN/dlopt-compile" "$work/g8.mlir" --train --optimizer sgd --quiet -o "$work/s.exe"
  else
    f=${fix%%:*}; c=${fix#*:}
    "$BIN/dlopt-compile" "$work/g8.mlir" --train --optimizer sgd --quiet --cluster "$c" --fix "$f" -o "$work/s.exe"
  fi
  rm -f "$work/m.jsonl"
  "$BIN/dlopt-run" "$work/s.exe" --steps 30 --data examples/data/corpus.npy --quiet --metrics "$work/m.jsonl"
  printf '  %-18s %s ms\n' "${fix%%:*}" "$(median "$work/m.jsonl")"
done
# Pipelining overhead: 4 micro-batches of 8 sequences, one device against
# pp=2 (1F1B and GPipe), both ranks as threads on the 2 cores.
printf 'gpt-tiny training step (4 micro-batches of 8, SGD), median of 30 steps:\n'
for fix in none pp=2,schedule=1f1b pp=2,schedule=gpipe; do
  if [ "$fix" = none ]; then
    "$BIN/dlopt-compile" "$work/g8.mlir" --train --optimizer sgd --accumulate 4 --quiet -o "$work/s.exe"
  else
    "$BIN/dlopt-compile" "$work/g8.mlir" --train --optimizer sgd --accumulate 4 --quiet --cluster cpu:2 --fix "$fix" -o "$work/s.exe"
  fi
  rm -f "$work/m.jsonl"
  "$BIN/dlopt-run" "$work/s.exe" --steps 30 --data examples/data/corpus.npy --quiet --metrics "$work/m.jsonl"
  printf '  %-18s %s ms\n' "$fix" "$(median "$work/m.jsonl")"
done
