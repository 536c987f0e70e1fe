#!/usr/bin/env bash
# Builds the runtime, the planner and their gtest suites with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer (UB is fatal), and runs the
# suites: runtime, kernels, planner, comm, cuda host logic (GPU tests skip).
# The build directory is shared with scripts/fuzz.sh (same flags, plus
# libFuzzer coverage). docs/testing.md, "Fuzzing and sanitizers".
#
#   scripts/sanitize.sh                  build and run the unit tests
#   scripts/sanitize.sh --configure-only configure the build directory only
#
# Environment: SAN_BUILD_DIR (default build-sanitize), JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SAN_BUILD_DIR:-build-sanitize}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # -O1 with line tables: fast enough to fuzz, and every report has file:line.
  # No NDEBUG, so the asserts run too.
  cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    -DDLOPT_FUZZ=ON -DDLOPT_SANITIZE=address,undefined -DDLOPT_ENABLE_CUDA=OFF \
    -DMLIR_DIR="$(llvm-config-22 --prefix)/lib/cmake/mlir"
fi
[ "${1:-}" = --configure-only ] && exit 0

start=$(date +%s)
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target \
  dlopt-runtime-tests dlopt_cpu_kernels_test dlopt-planner-tests \
  dlopt-comm-tests dlopt-cuda-tests dlopt-cuda-backend-tests dlopt-run
echo "sanitize: built in $(( $(date +%s) - start )) s"
start=$(date +%s)
# Every gtest suite; lit needs the compiler tools (not built here), GPU
# tests (label gpu, cuda-check-ops) and the MPI suite (label mpi: 4
# processes under mpirun; OpenMPI's own allocations would need leak
# suppressions) are left to the normal build.
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-2}" \
    -E '^(lit|cuda-check-ops|prediction)$' -LE 'gpu|mpi'
echo "sanitize: unit tests passed in $(( $(date +%s) - start )) s"
