#!/usr/bin/env bash
# Multi-process figures (docs/performance.md, "Launching"; docs/launch.md):
#   - dlopt's MPI all-reduce against OpenMPI's own MPI_Allreduce, 64 MiB
#     float32 over 4 local processes, in the same run (target: within 2x);
#   - sharded checkpoints of gpt2-small's AdamW training step (params and
#     both moments, about 1.5 GB) on 4 ranks (dp=2 x tp=2): save and load
#     throughput, in-graph and between-graph, against copying the same bytes
#     with cp (+ sync, since the checkpoint writer fsyncs) and reading them
#     with cat;
#   - one training step of the tiny gpt (dp=2 x tp=2) in the three layouts.
# Runs on the 2-core dev box with --oversubscribe (4 processes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }

echo "== MPI all-reduce, 64 MiB float32, 4 processes (same run) =="
mpirun -n 4 --oversubscribe "$BIN/dlopt-bench-mpi" | sed 's/^/  /'

echo "== sharded checkpoints: gpt2-small AdamW step, dp=2 x tp=2 =="
"$BIN/dlopt-gen" gpt --preset gpt2-small --batch 2 --seq 64 -q -o "$work/g.mlir"
"$BIN/dlopt-compile" "$work/g.mlir" --train --optimizer adamw --quiet \
  --cluster cpu:2 --fix dp=2,tp=2 -o "$work/g.exe"
for layout in in-graph between-graph; do
  run=("$BIN/dlopt-run")
  [ "$layout" = between-graph ] && run=(mpirun -n 4 --oversubscribe "$BIN/dlopt-run")
  rm -rf "$work/ck"
  sync
  out=$("${run[@]}" "$work/g.exe" --steps 1 --vocab 50257 --checkpoint-dir "$work/ck" 2>/dev/null)
  echo "  $layout save: $(echo "$out" | grep '^checkpoint:' | sed 's/^checkpoint: [^ ]* //')"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  out=$("${run[@]}" "$work/g.exe" --steps 1 --vocab 50257 --resume "$work/ck/step-000001" 2>/dev/null)
  echo "  $layout load: $(echo "$out" | grep '^resumed from' | sed 's/^resumed from [^ ]* //')"
done
bytes=$(du -sb "$work/ck/step-000001" | cut -f1)
t0=$(now); cp -r "$work/ck/step-000001" "$work/copy"; sync; t1=$(now)
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
t2=$(now); cat "$work/copy"/* > /dev/null; t3=$(now)
printf '  cp -r + sync of the same %s bytes: %.3f s (%.2f GB/s); cat: %.3f s (%.2f GB/s)\n' \
  "$bytes" "$(secs "$t0" "$t1")" "$(echo "$bytes / $(secs "$t0" "$t1") / 1000000000" | bc -l)" \
  "$(secs "$t2" "$t3")" "$(echo "$bytes / $(secs "$t2" "$t3") / 1000000000" | bc -l)"

echo "== one training step of the tiny gpt, dp=2 x tp=2, three layouts =="
"$BIN/dlopt-gen" gpt --preset gpt-tiny --batch 8 -q -o "$work/t.mlir"
"$BIN/dlopt-compile" "$work/t.mlir" --train --optimizer adamw --quiet \
  --cluster cpu:2 --fix dp=2,tp=2 -o "$work/t.exe"
for layout in in-graph between-graph hybrid; do
  case $layout in
    in-graph) run=("$BIN/dlopt-run") ;;
    between-graph) run=(mpirun -n 4 --oversubscribe "$BIN/dlopt-run") ;;
    hybrid) run=(mpirun -n 2 --oversubscribe "$BIN/dlopt-run" --devices-per-process 2) ;;
  esac
  "${run[@]}" "$work/t.exe" --steps 20 --vocab 64 --quiet --metrics "$work/$layout.jsonl"
  # The median step time of steps 2-20 (step 1 warms up).
  med=$(tail -n +2 "$work/$layout.jsonl" | sed 's/.*"step_time_s": \([0-9.e-]*\).*/\1/' | sort -g |
        awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '  %-13s median step %.2f ms\n' "$layout" "$(echo "$med * 1000" | bc -l)"
done
