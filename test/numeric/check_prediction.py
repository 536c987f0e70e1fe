#!/usr/bin/env python3
"""The planner's predicted step time and memory against a measured run.

dlopt-calibrate measures this machine; dlopt-compile plans and applies a
training step on the cluster it describes (--cluster, --calibration), which
stores the prediction in the plan file; dlopt-run trains a few steps and
prints the prediction beside the measured figures. For each case the
predicted step time must be within --bound (25%) of the measured median,
and the predicted memory per device never under the measured (the largest
program's planned arena, or what the backend allocated).

Op-level graphs (OP_MODELS: a cnn and an mlp) are checked the same way on
the step time (--op-bound; medians of 40 steps) and on memory: never under the planned arena, at
most --mem-over above it. They train on fixed random arrays
(--data-input), not synthetic data: the planner prices the device's work,
and on a 2-core CPU the loader thread drawing the next batch of normals
shares the cores with the two kernel threads (about 1.4 ms of CPU a step
for mlp-small's 256x784 images at 7 ns an element).

Timing depends on the machine being quiet: ctest runs this test alone
(RUN_SERIAL), and a case outside the bound is measured again, calibration
included, up to five times in all, waiting 15, 30, 60 and 90 s before
the retries, before it fails. The 2-vCPU hosts this runs on alternate
between a fast and a slow state for seconds to more than a minute
(cnn-small's step: 3.0-3.4 ms against 4.5-5.4 ms with the same binary,
from a shell or from Python, with no steal time reported; in the slow
state its memory-bound ops run about 2x slower and its convolutions 1.5x).
A probe traced it to the last-level cache, which the VM shares: an add
over 8 MiB drops from 110 to 70-80 GB/s in bursts while the same add in
L2 and a register-only loop do not move. dlopt-calibrate times each
sample by the median of its calls (not the fastest), so a stretch that
lasts through the calibration is priced; a burst that falls on the run
alone is what the retries are for.

Usage: check_prediction.py --work-dir DIR [--bin DIR] [--bound 0.25]
"""
import argparse
import os

import numpy as np
import re
import shutil
import subprocess
import sys
import time

# gpt-small (4 layers, hidden 256, 4 heads, seq 128, vocab 8192, batch 4):
# the CPU benchmark's case (docs/performance.md).
MODEL = ["gpt", "--layers", "4", "--hidden", "256", "--heads", "4", "--ffn", "1024",
         "--seq", "128", "--vocab", "8192", "--batch", "4"]
# (name, devices per node, --fix)
CASES = [("one device", 1, None), ("dp=2, ranks as threads", 2, "dp=2")]
# Op-level graphs (no transformer layout; docs/op-sharding.md): the step
# time within --op-bound, memory never under the planned arena and at most
# --mem-over above it (the kept activations are what dlopt's backward
# reads). Both have 10 classes: int inputs (labels) are drawn in [0, 10).
OP_MODELS = [("cnn-small, batch 64", ["cnn", "--preset", "cnn-small", "--batch", "64"]),
             ("mlp-small, batch 256", ["mlp", "--preset", "mlp-small", "--batch", "256"])]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    return p.stdout


def size(num, unit):
    return float(num) * UNITS[unit]


def arrays(tool, work, plan, tag):
    """--data-input flags binding each input of `plan` to 4 batches of fresh
    random rows (standard normals, ints in [0, 10))."""
    dump = run([tool("dlopt-run"), plan, "--dump"])
    rng = np.random.default_rng()
    flags = []
    for m in re.finditer(r"^\s*%\d+\s+input\s+(\S+)\s+(\S+?)x?(f32|i32)\s", dump, re.M):
        name, dims, dtype = m.group(1), m.group(2), m.group(3)
        shape = [int(d) for d in dims.split("x") if d]
        shape[0] *= 4
        a = (rng.standard_normal(shape).astype(np.float32) if dtype == "f32"
             else rng.integers(0, 10, shape).astype(np.int32))
        path = os.path.join(work, "%s.%s.npy" % (tag, name))
        np.save(path, a)
        flags += ["--data-input", "%s=%s" % (name, path)]
    if not flags:
        sys.exit("FAIL: %s: no inputs in the plan's dump:\n%s" % (plan, dump))
    return flags


def measure(tool, work, name, devices, fix, model="model.mlir", fixed_data=False, steps=10):
    tag = name.split()[0].replace(",", "")
    cal, cl = os.path.join(work, tag + ".cal.json"), os.path.join(work, tag + ".cluster.json")
    run([tool("dlopt-calibrate"), "--devices", str(devices), "-o", cal, "--cluster-out", cl])
    plan = os.path.join(work, tag + ".plan")
    cmd = [tool("dlopt-compile"), os.path.join(work, model), "--train", "--optimizer", "adamw",
           "--precision", "f32", "--cluster", cl, "--calibration", cal, "-o", plan]
    if fix:
        cmd += ["--fix", fix]
    run(cmd)
    data = arrays(tool, work, plan, tag) if fixed_data else []
    out = run([tool("dlopt-run"), plan, "--steps", str(steps), "--seed", "1"] + data)
    p = re.search(r"^prediction \(cluster [^)]*\): step ([0-9.]+) ms, memory ([0-9.]+) (\w+) per device",
                  out, re.M)
    m = re.search(r"^measured: step ([0-9.]+) ms .*, memory ([0-9.]+) (\w+) ", out, re.M)
    if not p or not m:
        sys.exit("FAIL: %s: dlopt-run printed no prediction:\n%s" % (name, out))
    return (float(p.group(1)), size(p.group(2), p.group(3)), float(m.group(1)),
            size(m.group(2), m.group(3)))


# The wait in seconds before each attempt of a case (the first at once):
# see the module comment.
WAITS_S = (0, 15, 30, 60, 90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--bin")
    ap.add_argument("--bound", type=float, default=0.25)
    # 30%: the op-level steps are 5-20 ms, and identical runs of them on the
    # shared 2-core dev box differ by 20% between processes even over 40
    # steps (docs/cost-model.md, "Measured against the prediction").
    ap.add_argument("--op-bound", type=float, default=0.30,
                    help="op-level cases: largest allowed step-time error")
    ap.add_argument("--mem-over", type=float, default=0.5,
                    help="op-level cases: largest allowed memory over-estimate")
    args = ap.parse_args()
    tool = (lambda n: os.path.join(args.bin, n)) if args.bin else (lambda n: shutil.which(n) or n)
    os.makedirs(args.work_dir, exist_ok=True)
    run([tool("dlopt-gen")] + MODEL + ["-q", "-o", os.path.join(args.work_dir, "model.mlir")])
    failed = 0
    for name, devices, fix in CASES:
        for attempt, wait in enumerate(WAITS_S, 1):
            time.sleep(wait)
            pt, pm, mt, mm = measure(tool, args.work_dir, name, devices, fix)
            err = pt / mt - 1
            ok_time = abs(err) <= args.bound
            ok_mem = pm >= mm
            print("%s: step predicted %.1f ms, measured %.1f ms (%+.1f%%); memory predicted %.1f MiB, "
                  "measured %.1f MiB (%+.1f%%)%s" % (
                      name, pt, mt, 100 * err, pm / 2**20, mm / 2**20, 100 * (pm / mm - 1),
                      "" if ok_time and ok_mem else " (attempt %d)" % attempt))
            if ok_time and ok_mem:
                break
        if not ok_time:
            print("FAIL: %s: predicted step time %+.1f%% off the measured (bound %.0f%%)" % (
                name, 100 * err, 100 * args.bound))
            failed += 1
        if not ok_mem:
            print("FAIL: %s: predicted memory under the measured" % name)
            failed += 1
    for name, gen in OP_MODELS:
        model = name.split(",")[0] + ".mlir"
        run([tool("dlopt-gen")] + gen + ["-q", "-o", os.path.join(args.work_dir, model)])
        for attempt, wait in enumerate(WAITS_S, 1):
            time.sleep(wait)
            # 40 steps (0.2-0.8 s): a 5 ms step measured over 10 varied
            # from 3.9 to 12 ms between identical runs on the shared dev box.
            pt, pm, mt, mm = measure(tool, args.work_dir, name, 1, None, model,
                                     fixed_data=True, steps=40)
            err = pt / mt - 1
            ok_time = abs(err) <= args.op_bound
            over = pm / mm - 1
            print("%s: step predicted %.1f ms, measured %.1f ms (%+.1f%%); memory predicted "
                  "%.2f MiB, measured %.2f MiB (%+.1f%%)%s" % (
                      name, pt, mt, 100 * err, pm / 2**20, mm / 2**20, 100 * over,
                      "" if ok_time else " (attempt %d)" % attempt))
            if ok_time:
                break
        if not ok_time:
            print("FAIL: %s: predicted step time %+.1f%% off the measured (bound %.0f%%)" % (
                name, 100 * err, 100 * args.op_bound))
            failed += 1
        if pm < mm:
            print("FAIL: %s: predicted memory under the measured" % name)
            failed += 1
        elif over > args.mem_over:
            print("FAIL: %s: predicted memory %.0f%% over the measured (bound %.0f%%)" % (
                name, 100 * over, 100 * args.mem_over))
            failed += 1
    if failed:
        return 1
    print("all cases within the bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
