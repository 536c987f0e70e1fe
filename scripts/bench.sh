#!/usr/bin/env bash
# Prints dlopt's performance figures (no pass/fail; see docs/performance.md).
#   compile:  dlopt-compile and dlopt-opt on the gpt3-175b forward graph
#   matmul:   CPU backend matmul vs. OpenBLAS sgemm at 1024^3
#   run:      CPU forward time of small GPT presets
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}/bin
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
now() { date +%s.%N; }
best_of() { # best_of N cmd...: the fastest of N runs, in seconds
  local n=$1; shift; local best=
  for _ in $(seq "$n"); do
    local t0; t0=$(now); "$@" >/dev/null 2>&1; local t1; t1=$(now)
    best=$(/usr/bin/python3 -c "t=$t1-$t0; b='$best'; print(t if not b or t<float(b) else b)")
  done
  printf '%.3f' "$best"
}

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
"$B/dlopt-gen" gpt --preset gpt3-175b -q -o "$W/gpt3-175b.mlir"
echo "== compile (gpt3-175b forward, $(grep -c 'dlopt\.' "$W/gpt3-175b.mlir") lines with dlopt ops)"
echo "dlopt-compile gpt3-175b: $(best_of 3 "$B/dlopt-compile" "$W/gpt3-175b.mlir" -o "$W/g.plan" --quiet) s  (target < 10 s)"
echo "dlopt-opt parse+verify gpt3-175b: $(best_of 3 "$B/dlopt-opt" "$W/gpt3-175b.mlir" -o /dev/null) s  (target < 2 s)"
"$B/dlopt-compile" "$W/gpt3-175b.mlir" -o "$W/g.plan" --timing

if [ -x "$B/dlopt-bench-cpu-matmul" ]; then
  echo "== matmul"
  "$B/dlopt-bench-cpu-matmul"
fi

echo "== CPU forward (f32, seed 0, synthetic tokens)"
for preset in gpt-tiny gpt2-small; do
  case $preset in gpt2-small) extra="--seq 256 --batch 1";; *) extra="";; esac
  "$B/dlopt-gen" gpt --preset $preset $extra -q -o "$W/$preset.mlir"
  "$B/dlopt-compile" "$W/$preset.mlir" -o "$W/$preset.plan" --quiet
  shape=$("$B/dlopt-run" "$W/$preset.plan" --dump | awk '$2=="input" && $3=="tokens" {print $4}')
  /usr/bin/python3 - "$W" "$shape" <<'PY'
import sys, numpy as np
w, shape = sys.argv[1], sys.argv[2]
dims = [int(d) for d in shape.split("x")[:-1]]
rng = np.random.default_rng(0)
np.save(f"{w}/tokens.npy", rng.integers(0, 100, dims, dtype=np.int32))
np.save(f"{w}/labels.npy", rng.integers(0, 100, dims, dtype=np.int32))
PY
  echo "$preset ($extra): best of 3: $(best_of 3 "$B/dlopt-run" "$W/$preset.plan" --input tokens="$W/tokens.npy" --input labels="$W/labels.npy" --quiet) s per forward"
done

echo "== CPU training step (gpt2-small, seq 256, batch 1, adamw, f32, synthetic tokens)"
"$B/dlopt-gen" gpt --preset gpt2-small --seq 256 --batch 1 -q -o "$W/gpt2s.mlir"
t0=$(now)
"$B/dlopt-compile" "$W/gpt2s.mlir" --train -o "$W/gpt2s-train.plan" --quiet
echo "compile --train: $(/usr/bin/python3 -c "print(round($(now)-$t0, 3))") s"
"$B/dlopt-run" "$W/gpt2s-train.plan" --steps 3 --seed 0 --metrics "$W/m.jsonl" --log-every 1 >/dev/null 2>&1
/usr/bin/python3 - "$W/m.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = max(r.get("tokens_per_s") or 0 for r in rows[1:] or rows)
print(f"gpt2-small train step: {min(r['step_time_s'] for r in rows):.2f} s, {best:.0f} tokens/s (best of {len(rows)} steps)")
PY
