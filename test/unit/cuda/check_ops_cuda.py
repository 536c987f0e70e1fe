#!/usr/bin/env python3
"""The op conformance suite on the cuda backend, for ctest (label `gpu`).

  check_ops_cuda.py --bin-dir BUILD/bin [--cases DIR] [--work-dir DIR]

1. Runs dlopt-cuda-probe; without a usable GPU it prints the reason and
   exits 77 (ctest: skipped).
2. With dlopt-compile in --bin-dir (a compiler build): runs
   test/numeric/check_ops.py --backend cuda, i.e. every case against the
   NumPy float64 reference with the suite's per-dtype tolerances. Cases
   whose op has no CUDA kernel (dlopt-run: "not supported by the cuda
   backend") are listed as unsupported, not failed.
3. Without dlopt-compile (a runtime-only build, e.g. on a GPU machine
   without MLIR): runs compare_backends.py on pre-compiled cases from
   --cases or $DLOPT_CHECK_OPS_CASES (cuda against cpu); without them it
   exits 77 saying how to make them.
Exits 1 when a supported case fails.
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NUMERIC = os.path.join(HERE, "..", "..", "numeric")
SKIP = 77


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--cases", default=os.environ.get("DLOPT_CHECK_OPS_CASES"))
    ap.add_argument("--work-dir")
    ap.add_argument("--seed")
    args = ap.parse_args()

    probe = subprocess.run([os.path.join(args.bin_dir, "dlopt-cuda-probe")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(probe.stdout.strip())
    if probe.returncode == SKIP:
        return SKIP
    if probe.returncode != 0:
        print("dlopt-cuda-probe failed (rc %d)" % probe.returncode)
        return 1

    if not os.path.exists(os.path.join(args.bin_dir, "dlopt-compile")):
        if not args.cases:
            print("SKIP: runtime-only build (no dlopt-compile) and no pre-compiled cases: on a "
                  "compiler build run `test/numeric/check_ops.py --backend cpu --work-dir DIR`, "
                  "carry DIR here and pass --cases DIR (or set DLOPT_CHECK_OPS_CASES)")
            return SKIP
        return subprocess.call([sys.executable, os.path.join(HERE, "compare_backends.py"),
                                "--cases", args.cases, "--bin-dir", args.bin_dir])

    cmd = [sys.executable, os.path.join(NUMERIC, "check_ops.py"), "--backend", "cuda",
           "--bin-dir", args.bin_dir]
    if args.work_dir:
        cmd += ["--work-dir", args.work_dir]
    if args.seed:
        cmd += ["--seed", args.seed]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed, unsupported = [], []
    for line in r.stdout.splitlines():
        print(line)
        m = re.match(r"FAIL (\S+): (.*)", line)
        if m:
            (unsupported if "not supported by the cuda backend" in m.group(2) else failed).append(m.group(1))
    if unsupported:
        print("unsupported on cuda (no kernel yet, docs/gpu.md): " + " ".join(unsupported))
    if failed:
        print("FAILED on cuda: " + " ".join(failed))
        return 1
    if r.returncode != 0 and not unsupported:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
