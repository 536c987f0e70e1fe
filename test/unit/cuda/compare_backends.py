#!/usr/bin/env python3
"""Runs pre-compiled op cases on the cuda and the cpu backend and compares.

A case is a directory holding case.plan and its inputs as NAME.npy (what
`test/numeric/check_ops.py --backend cpu --work-dir DIR` leaves in DIR, one
directory per case). This is how the conformance suite runs on a machine
without the compiler (a runtime-only build on a GPU machine): compile and
keep the cases elsewhere, carry DIR over, then

  compare_backends.py --cases DIR [--bin-dir BUILD/bin] [--filter REGEX]

Each case runs `dlopt-run --backend cpu` and `--backend cuda`; every output
must agree within the per-dtype tolerance of test/numeric/dlopt_np.py
(scaled by --scale, since both sides carry rounding error; the reference is
the cpu output), ints and i1 exactly. A case the cpu backend rejects must be
rejected by the cuda backend too (non-zero exit, no crash). A case using an
op without a CUDA kernel is reported as unsupported, not failed. Exits 1 on
any failure.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "numeric"))
from dlopt_np import compare, find_tool  # noqa: E402

DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
          np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.bool_): "i1"}


RUN_TIMEOUT = 600


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=RUN_TIMEOUT)


def output_types(tool, plan):
    """{output name: element type} from `dlopt-run --dump` ("  NAME = %ID :
    4x8xbf16"); .npy cannot tell bf16 (written as f32) from f32."""
    r = run([tool, plan, "--dump"])
    types, inside = {}, False
    for line in r.stdout.splitlines():
        if line.startswith("outputs:"):
            inside = True
            continue
        if inside:
            m = re.match(r"\s+(\S+) = %\d+ : (\S+)", line)
            if not m:
                break
            types[m.group(1)] = m.group(2).split("x")[-1]
    return types


def dtype_of(arr, name, types):
    return types.get(os.path.splitext(name)[0], DTYPES.get(arr.dtype, "f32"))


def run_case(d, tool, scale, cpu_threads=None):
    plan = os.path.join(d, "case.plan")
    inputs = []
    for p in sorted(glob.glob(os.path.join(d, "*.npy"))):
        inputs += ["--input", "%s=%s" % (os.path.splitext(os.path.basename(p))[0], p)]
    outs = {}
    for backend in ("cpu", "cuda"):
        od = os.path.join(d, "out-" + backend)
        threads = ["--threads", str(cpu_threads)] if backend == "cpu" and cpu_threads else []
        r = run([tool, plan, "--backend", backend, "--quiet", "--output-dir", od] + threads + inputs)
        outs[backend] = (r, od)
    (rc, oc), (rg, og) = outs["cpu"], outs["cuda"]
    if "not supported by the cuda backend" in rg.stderr:
        return "unsupported", rg.stderr.strip().splitlines()[-1]
    if rg.returncode < 0 or rg.returncode >= 128:
        return "fail", "dlopt-run --backend cuda crashed (rc %d): %s" % (rg.returncode, rg.stderr.strip()[-300:])
    if rc.returncode != 0:
        if rg.returncode == 0:
            return "fail", "the cpu backend rejects the case, cuda does not: %s" % rc.stderr.strip()[-200:]
        return "pass", "both reject it: %s" % rg.stderr.strip().splitlines()[-1][:120]
    if rg.returncode != 0:
        return "fail", "dlopt-run --backend cuda failed (rc %d): %s" % (rg.returncode, rg.stderr.strip()[-400:])
    details = []
    ok_all = True
    types = output_types(tool, plan)
    for p in sorted(glob.glob(os.path.join(oc, "*.npy"))):
        name = os.path.basename(p)
        q = os.path.join(og, name)
        if not os.path.exists(q):
            return "fail", "cuda wrote no %s" % name
        want, got = np.load(p), np.load(q)
        dt = dtype_of(want, name, types)
        ok, det = compare(got, want.astype(np.float64) if dt not in ("i32", "i64", "i1") else want,
                          dt, scale=scale)
        ok_all &= ok
        details.append("%s: %s" % (name, det))
    return ("pass" if ok_all else "fail"), "; ".join(details)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", required=True, help="directory of case directories")
    ap.add_argument("--bin-dir", help="directory of dlopt-run (default: PATH)")
    ap.add_argument("--filter", help="only cases whose name matches this regex")
    ap.add_argument("--scale", type=float, default=4.0, help="tolerance scale (default 4)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per dlopt-run (default 600)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="cases run at once (default 1; each cpu run then gets cores/jobs threads)")
    args = ap.parse_args()
    global RUN_TIMEOUT
    RUN_TIMEOUT = args.timeout
    tool = find_tool("dlopt-run", args.bin_dir)
    pat = re.compile(args.filter) if args.filter else None
    dirs = sorted(d for d in glob.glob(os.path.join(args.cases, "*"))
                  if os.path.exists(os.path.join(d, "case.plan")))
    if not dirs:
        print("no case directories with a case.plan under %s" % args.cases)
        return 1
    counts = {"pass": 0, "fail": 0, "unsupported": 0}
    failed = []
    dirs = [d for d in dirs if not pat or pat.search(os.path.basename(d))]
    jobs = max(1, args.jobs)
    cpu_threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None

    def one(d):
        try:
            return run_case(d, tool, args.scale, cpu_threads)
        except subprocess.TimeoutExpired as e:
            return "fail", "timed out after %s s: %s" % (e.timeout, " ".join(e.cmd[:4]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for d, (verdict, det) in zip(dirs, pool.map(one, dirs)):
            name = os.path.basename(d)
            counts[verdict] += 1
            if verdict == "fail":
                failed.append(name)
            print("%s %s: %s" % (verdict.upper(), name, det))
            sys.stdout.flush()
    print("%d passed, %d failed, %d unsupported on cuda" % (counts["pass"], counts["fail"], counts["unsupported"]))
    if failed:
        print("failed cases: " + " ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
