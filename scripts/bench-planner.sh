#!/usr/bin/env bash
# Times `dlopt-compile --dry-run` (parse + graph summary + plan search +
# report) for the planning targets of docs/performance.md. Prints figures;
# it does not pass or fail. Usage: scripts/bench-planner.sh [build-dir]
set -euo pipefail
B=${1:-build}/bin
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$B/dlopt-gen" gpt3-175b -q -o "$T/gpt3-175b.mlir"
"$B/dlopt-gen" gpt --layers 128 --hidden 25600 --heads 160 -q -o "$T/gpt-1t.mlir"
"$B/dlopt-gen" gpt3-1.3b -q -o "$T/gpt3-1.3b.mlir"
# A heterogeneous cluster: 64 DGX A100 nodes, then 64 DGX H100 nodes.
cat > "$T/mixed-128.yaml" <<'EOF2'
name: mixed-128
gpus_per_node: 8
intra_node: {topology: nvswitch, bidirectional_bandwidth_gb_s: 600, latency_us: 1}
network: {nics: 8, nic_gbit_s: 200, latency_us: 5}
nodes:
  - count: 64
    gpu: a100-sxm-80gb
  - count: 64
    gpu: h100-sxm-80gb
EOF2
run() { # name model cluster global-batch
  local best=1e9
  for _ in 1 2 3 4 5; do
    local s e
    s=$(date +%s.%N)
    "$B/dlopt-compile" "$T/$2.mlir" --dry-run --train --precision bf16 \
      --cluster "$3" --global-batch "$4" > "$T/out.txt"
    e=$(date +%s.%N)
    best=$(echo "$e - $s" | bc -l | awk -v b="$best" '{print ($1 < b) ? $1 : b}')
  done
  local plan
  plan=$(sed -n 's/^  \(dp=.*\) (dp.*/\1/p' "$T/out.txt")
  plan="$plan, $(sed -n 's/^  \(schedule .*\), optimizer.*/\1/p' "$T/out.txt")"
  plan="$plan, $(sed -n 's/.*\(MFU [0-9.]*%\).*/\1/p' "$T/out.txt")"
  printf '%-10s %-16s batch %-5s %8.3f s  plan: %s\n' "$2" "${3##*/}" "$4" "$best" "$plan"
}
run 175b gpt3-175b dgx-a100:128 1536
run 1t gpt-1t dgx-a100:384 3072
run 1.3b gpt3-1.3b dgx-a100:1 512
run 175b-mixed gpt3-175b "$T/mixed-128.yaml" 1536
