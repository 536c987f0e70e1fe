#!/usr/bin/env bash
# Builds dlopt and runs every test: gtest suites, lit suites (IR, passes,
# tools, numeric checks against NumPy, end-to-end); then the hardening
# checks: the ASan+UBSan build's unit tests (scripts/sanitize.sh) and a
# bounded libFuzzer run of every reader (scripts/fuzz.sh).
#
#   scripts/test.sh
#
# Environment: SANITIZE=0 skips the sanitizer build's unit tests,
# FUZZ_SECONDS=N fuzzes N seconds per target (default 12, which keeps CI near 30 minutes; 0 skips fuzzing).
# Both are on by default, so CI and a local run check the same things.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/build.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-2}"
# Both hardening checks run even if the first fails, so one CI run reports
# every sanitizer and fuzzer finding.
status=0
if [ "${SANITIZE:-1}" != 0 ]; then
  scripts/sanitize.sh || status=1
fi
if [ "${FUZZ_SECONDS:-12}" != 0 ]; then
  scripts/fuzz.sh "${FUZZ_SECONDS:-12}" || status=1
fi
exit $status
