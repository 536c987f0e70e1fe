#!/usr/bin/env bash
# Builds the libFuzzer targets (test/fuzz) with ASan+UBSan and, per target,
# runs its regression inputs, then fuzzes it for a bounded time. Any crash,
# leak, timeout, out-of-memory, sanitizer report or broken round trip fails
# the run: the target, the report and the reproducer (path, hex dump,
# base64) are printed. docs/testing.md, "Fuzzing and sanitizers".
#
#   scripts/fuzz.sh [SECONDS [TARGET...]]    default: 30 s each, every target
#
# Environment: SAN_BUILD_DIR (default build-sanitize, shared with
# scripts/sanitize.sh), JOBS (build jobs, 2), FUZZ_JOBS (targets run at once,
# 2). New corpus entries accumulate in $SAN_BUILD_DIR/fuzz/corpus/TARGET.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
shift || true
BUILD_DIR=${SAN_BUILD_DIR:-build-sanitize}
ALL_TARGETS=(executable npy safetensors checkpoint tokens cluster-yaml
             cluster-json plan calibration profile nccl-tests fix mlir)
TARGETS=("$@")
[ $# -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")

scripts/sanitize.sh --configure-only
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target dlopt-fuzzers
echo "fuzz: targets built in $(( $(date +%s) - start )) s"

work=$BUILD_DIR/fuzz
rm -rf "$work/seeds" "$work/logs" "$work/artifacts"
mkdir -p "$work/seeds" "$work/logs" "$work/artifacts" "$work/corpus"
PYTHON=$(command -v /usr/bin/python3 || command -v python3)
"$PYTHON" test/fuzz/seeds.py collect "$work/seeds"

# Longest generated input: room above the largest seed. Deep nesting is
# covered by the regression inputs, which run whole.
max_len() {
  case $1 in
    fix) echo 1024 ;;
    executable|plan) echo 65536 ;;
    *) echo 16384 ;;
  esac
}
dict() {
  case $1 in
    executable|safetensors|checkpoint|plan|calibration|profile|cluster-json)
      echo "test/fuzz/dict/json.dict" ;;
    cluster-yaml) echo "test/fuzz/dict/yaml.dict" ;;
    fix) echo "test/fuzz/dict/fix.dict" ;;
    nccl-tests) echo "test/fuzz/dict/nccl-tests.dict" ;;
    mlir) echo "$work/seeds/mlir.dict" ;;
  esac
}

# UBSan stops at the first report (the build has -fno-sanitize-recover);
# LeakSanitizer is on. timeout(1) is a backstop: libFuzzer itself stops
# after -max_total_time and fails an input that runs over -timeout.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_one() {
  local t=$1 bin=$BUILD_DIR/bin/dlopt-fuzz-$1
  local corpus=$work/corpus/$t art=$work/artifacts/$t log=$work/logs/$1
  mkdir -p "$corpus" "$art"
  local rc=0
  # Regression inputs, whole (they are larger than -max_len): executing
  # files, libFuzzer runs each once.
  if [ -d "$work/seeds/regress/$t" ]; then
    timeout -k 10 600 "$bin" -timeout=10 -rss_limit_mb=2048 \
      "$work/seeds/regress/$t"/* >"$log.regress.log" 2>&1 || rc=$?
  fi
  echo "$rc" >"$log.regress.rc"
  local seeds=() d
  for d in "test/fuzz/corpus/$t" "$work/seeds/$t"; do
    if [ -d "$d" ]; then seeds+=("$d"); fi
  done
  d=$(dict "$t")
  rc=0
  timeout -k 10 $((SECONDS_EACH * 2 + 300)) \
    "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -max_len="$(max_len "$t")" ${d:+-dict="$d"} -print_final_stats=1 \
      -artifact_prefix="$art/" "$corpus" "${seeds[@]}" \
      >"$log.log" 2>&1 || rc=$?
  echo "$rc" >"$log.rc"
}

start=$(date +%s)
running=0
for t in "${TARGETS[@]}"; do
  [ -x "$BUILD_DIR/bin/dlopt-fuzz-$t" ] || { echo "fuzz: no target '$t'" >&2; exit 1; }
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "${FUZZ_JOBS:-2}" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true
elapsed=$(( $(date +%s) - start ))

# The report in a log: from the first sanitizer/libFuzzer error line on.
report() {
  awk '/^(==[0-9]+== ?ERROR|ERROR: libFuzzer|.*runtime error:|.*property failed|SUMMARY:|INFO: a leak)/{p=1} p && n++ < 120' \
    "$1"
}
dump() {
  echo "--- hex (first $2 bytes):"
  head -c "$2" "$1" | od -A x -t x1z -v
}

failed=()
printf '\n%-13s %10s %6s %7s %7s  %s\n' target executions time corpus cov result
for t in "${TARGETS[@]}"; do
  log=$work/logs/$t
  rc=$(cat "$log.rc" 2>/dev/null || echo '?')
  rrc=$(cat "$log.regress.rc" 2>/dev/null || echo '?')
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log.log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log.log" | tail -1)
  # The last status line: "#N  DONE/pulse  cov: C ft: F corp: K/SIZE ...".
  cov=$(grep -oE 'cov: [0-9]+' "$log.log" | tail -1 | cut -d' ' -f2 || true)
  corp=$(grep -oE 'corp: [0-9]+' "$log.log" | tail -1 | cut -d' ' -f2 || true)
  result=ok
  if [ "$rrc" != 0 ]; then
    result="FAILED (regression input)"
  fi
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc)"
  fi
  [ "$result" = ok ] || failed+=("$t")
  printf '%-13s %10s %5ss %7s %7s  %s\n' "$t" "${runs:-?}" "${secs:-?}" \
    "${corp:-?}" "${cov:-?}" "$result"
done
echo "fuzz: ${#TARGETS[@]} targets, ${SECONDS_EACH} s each, ${elapsed} s wall"

for t in "${failed[@]}"; do
  log=$work/logs/$t
  if [ "$(cat "$log.regress.rc")" != 0 ]; then
    input=$(sed -n 's/^Running: //p' "$log.regress.log" | tail -1)
    echo
    echo "=== fuzz target '$t' failed on a regression input: report ==="
    report "$log.regress.log"
    echo "--- reproducer: $input ($(stat -c %s "$input") bytes; written by"
    echo "    test/fuzz/seeds.py collect DIR as DIR/regress/$t/$(basename "$input"))"
    echo "    rerun: $BUILD_DIR/bin/dlopt-fuzz-$t $input"
    dump "$input" 256
  fi
  if [ "$(cat "$log.rc")" != 0 ]; then
    echo
    echo "=== fuzz target '$t' failed: report ==="
    report "$log.log"
    for f in "$work/artifacts/$t"/*; do
      [ -f "$f" ] || continue
      echo "--- reproducer: $f ($(stat -c %s "$f") bytes)"
      echo "    rerun: $BUILD_DIR/bin/dlopt-fuzz-$t $f"
      dump "$f" 1024
      echo "--- base64 (first 64 KiB):"
      head -c 65536 "$f" | base64 -w 76
    done
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crashes"
