#!/usr/bin/env bash
# GPU training-step benchmark: dlopt (cuda backend) against PyTorch eager and
# torch.compile, for GPT-2 small/medium/large and GPT-3 1.3B, bf16, AdamW,
# one GPU. Two phases, so a GPU machine without MLIR can run it:
#
#   scripts/bench-gpu.sh prepare [PLANS]   # needs dlopt-gen + dlopt-compile
#       writes PLANS/<model>.plan (dlopt-compile --train --precision bf16)
#       and PLANS/<model>.estimate.json (the planner's dry run on one H100)
#   scripts/bench-gpu.sh run [PLANS] [OUT]  # needs a GPU and dlopt-run built
#       with the cuda backend (a runtime-only build is enough)
#       runs each plan with dlopt-run --backend cuda, then bench/gpu/torch_gpt.py,
#       and writes OUT/results.jsonl and a table OUT/summary.txt
#
# Environment: BUILD (default build-cuda, else build), MODELS (default
# "gpt2-small gpt2-medium gpt2-large gpt3-1.3b"), BATCH (8; gpt3-1.3b uses
# BATCH_1P3B, default 4), STEPS (10), WARMUP (3), TORCH_MODES
# ("eager,compile"; empty skips PyTorch), PYTHON (python3).
#
# Reported: median step time, tokens/s, MFU against the measured bf16 GEMM
# rate (the ceiling) and the datasheet peak, peak device memory against the
# memory plan and the planner's estimate. Defaults PLANS=bench/gpu/plans,
# OUT=bench/gpu/results. Status: written without a GPU; never run yet.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODELS="${MODELS:-gpt2-small gpt2-medium gpt2-large gpt3-1.3b}"
BATCH="${BATCH:-8}"
BATCH_1P3B="${BATCH_1P3B:-4}"
STEPS="${STEPS:-10}"
WARMUP="${WARMUP:-3}"
TORCH_MODES="${TORCH_MODES-eager,compile}"
# "eager compile" means the same as "eager,compile".
TORCH_MODES="$(echo "$TORCH_MODES" | tr -s ' ' ',' | sed 's/^,//; s/,$//')"
PYTHON="${PYTHON:-python3}"
if [[ -z "${BUILD:-}" ]]; then
  BUILD=build-cuda
  [[ -x "$BUILD/bin/dlopt-run" ]] || BUILD=build
fi
BIN="$ROOT/$BUILD/bin"

batch_of() { [[ "$1" == gpt3-1.3b ]] && echo "$BATCH_1P3B" || echo "$BATCH"; }

prepare() {
  local plans="${1:-bench/gpu/plans}"
  mkdir -p "$plans"
  for tool in dlopt-gen dlopt-compile; do
    [[ -x "$BIN/$tool" ]] || { echo "bench-gpu: $BIN/$tool not found (a compiler build is needed to prepare plans)" >&2; exit 1; }
  done
  printf 'nodes: 1\ngpus_per_node: 1\ngpu: h100-sxm-80gb\n' > "$plans/one-h100.yaml"
  for m in $MODELS; do
    local b; b="$(batch_of "$m")"
    "$BIN/dlopt-gen" "$m" --batch "$b" -q -o "$plans/$m.mlir"
    "$BIN/dlopt-compile" "$plans/$m.mlir" --train --precision bf16 --quiet -o "$plans/$m.plan"
    "$BIN/dlopt-compile" "$plans/$m.mlir" --train --precision bf16 --dry-run \
      --cluster "$plans/one-h100.yaml" --fix "dp=1,tp=1,pp=1,mbs=$b" --format=json \
      > "$plans/$m.estimate.json"
    echo "bench-gpu: prepared $plans/$m.plan (batch $b)"
  done
}

run() {
  local plans="${1:-bench/gpu/plans}" out="${2:-bench/gpu/results}"
  mkdir -p "$out"
  local results="$out/results.jsonl"
  : > "$results"
  if ! "$BIN/dlopt-cuda-probe"; then
    echo "bench-gpu: no usable GPU (see above)" >&2
    exit 77
  fi
  "$PYTHON" bench/gpu/torch_gpt.py --gemm-only --json "$results" || true
  for m in $MODELS; do
    local plan="$plans/$m.plan" b; b="$(batch_of "$m")"
    if [[ ! -f "$plan" ]]; then
      echo "bench-gpu: $plan missing (run 'scripts/bench-gpu.sh prepare' on a compiler build)" >&2
      continue
    fi
    local metrics="$out/$m.dlopt-metrics.jsonl" log="$out/$m.dlopt.log"
    rm -f "$metrics"
    if "$BIN/dlopt-run" "$plan" --backend cuda --steps $((WARMUP + STEPS)) \
        --vocab 50257 --metrics "$metrics" --log-every 1 > "$log" 2>&1; then
      "$PYTHON" - "$m" "$b" "$WARMUP" "$metrics" "$log" "$plans/$m.estimate.json" "$results" <<'PY'
import json, re, statistics, sys
model, batch, warmup, metrics, log, estimate, results = sys.argv[1:]
steps = [json.loads(l) for l in open(metrics)][int(warmup):]
t = statistics.median(s["step_time_s"] for s in steps)
text = open(log).read()
mem = re.search(r"device memory: planned (.+?), peak (.+?) \(arena .*?cudaMemGetInfo delta (.+?)\) on (.+)", text)
row = {"framework": "dlopt", "model": model, "batch": int(batch), "step_time_s": t,
       "tokens_per_s": statistics.median(s["tokens_per_s"] for s in steps),
       "loss_first": steps[0]["loss"], "loss_last": steps[-1]["loss"]}
if mem:
    row.update(planned_memory=mem.group(1), peak_memory=mem.group(2),
               memgetinfo_peak=mem.group(3), device=mem.group(4))
try:
    est = json.load(open(estimate))
    row["planner_estimate_bytes"] = est["report"]["memory"]["total"]
    row["planner_step_time_s"] = est["report"]["step_time"]["total"]
    md = est["model"]
    tokens = int(batch) * md["seq"]
    # Same model-FLOPs count as bench/gpu/torch_gpt.py step_flops().
    flops = 6.0 * md["params"] * tokens + 6.0 * md["layers"] * md["seq"] * md["hidden"] * tokens
    row["model_tflops_per_step"] = flops / 1e12
    row["model_tflops"] = flops / t / 1e12
    gemm = [json.loads(l) for l in open(results) if '"gemm"' in l]
    if gemm and gemm[0].get("bf16_gemm_tflops"):
        row["mfu_vs_gemm"] = row["model_tflops"] / gemm[0]["bf16_gemm_tflops"]
    if gemm and gemm[0].get("datasheet_bf16_tflops"):
        row["mfu_vs_peak"] = row["model_tflops"] / gemm[0]["datasheet_bf16_tflops"]
except Exception as e:
    row["estimate_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(row))
open(results, "a").write(json.dumps(row) + "\n")
PY
    else
      echo "bench-gpu: dlopt-run failed on $m (see $log):" >&2
      tail -3 "$log" >&2
      echo "{\"framework\": \"dlopt\", \"model\": \"$m\", \"error\": \"see $log\"}" >> "$results"
    fi
    if [[ -n "$TORCH_MODES" ]]; then
      "$PYTHON" bench/gpu/torch_gpt.py --model "$m" --batch "$b" --modes "$TORCH_MODES" \
        --steps "$STEPS" --warmup "$WARMUP" --json "$results" | grep -v '"framework": "gemm"' || true
    fi
  done
  "$PYTHON" - "$results" > "$out/summary.txt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
gemm = next((r for r in rows if r.get("framework") == "gemm"), {})
ceiling = gemm.get("bf16_gemm_tflops")
print("device %s, measured bf16 GEMM %.0f TFLOP/s (datasheet %s)" % (
    gemm.get("device", "?"), ceiling or 0, gemm.get("datasheet_bf16_tflops")))
print("%-12s %-16s %6s %10s %12s %8s %s" % ("model", "run", "batch", "step ms", "tokens/s", "MFU", "memory"))
for r in rows:
    if r.get("framework") == "gemm":
        continue
    run = r["framework"] + ("/" + r["mode"] if "mode" in r else "")
    if "error" in r:
        print("%-12s %-16s %6s  error: %s" % (r["model"], run, r.get("batch", ""), r["error"]))
        continue
    mfu = r.get("mfu_vs_gemm")
    mem = r.get("peak_memory") or "%.2f GiB" % (r.get("peak_memory_bytes", 0) / 2**30)
    if "planner_estimate_bytes" in r:
        mem += " (planned %s, planner %.2f GiB)" % (r.get("planned_memory"), r["planner_estimate_bytes"] / 2**30)
    print("%-12s %-16s %6d %10.1f %12.0f %8s %s" % (r["model"], run, r["batch"], r["step_time_s"] * 1e3,
          r["tokens_per_s"], "%.1f%%" % (100 * mfu) if mfu else "-", mem))
PY
  cat "$out/summary.txt"
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,23p' "$0"; exit 2 ;;
esac
