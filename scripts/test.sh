#!/usr/bin/env bash
# Builds dlopt and runs every test: gtest suites, lit suites (IR, passes,
# tools, numeric checks against NumPy, end-to-end). Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/build.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-2}"
