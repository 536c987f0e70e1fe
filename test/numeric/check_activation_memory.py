#!/usr/bin/env python3
"""The planner's activation memory per layer against dlopt's memory plans.

For each model and plan, compiles the training step with 2 and 4 layers (or
the case's own second depth) and
takes the growth of the largest rank's scratch peak per added layer: the
activations one layer keeps for its backward pass (the peak is at the start
of the backward pass at these shapes, where every layer's activations are
alive and no gradient exists yet). The planner's dry run for the same plan
gives its activations (plus transient) for both depths; their growth per
layer must be within [-0.5%, +2%] of dlopt's. (The arena packs buffers
with alignment and reuse, which moves a peak by a few KiB either way; the
planner's fragmentation allowance covers that in its totals.)

Usage: check_activation_memory.py --work-dir DIR [--bin DIR] [--only NAME]
(--bin: where dlopt-gen, dlopt-compile and dlopt-run are; default: PATH)
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

# (name, dlopt-gen arguments, --fix, cluster)
GPT = ["gpt", "--preset", "gpt-tiny", "--hidden", "128", "--heads", "8",
       "--seq", "256", "--batch", "2", "--vocab", "256"]
LLAMA = ["llama", "--preset", "llama-tiny", "--hidden", "128", "--heads", "8",
         "--kv-heads", "2", "--ffn", "352", "--seq", "256", "--batch", "2",
         "--vocab", "256"]
CASES = [
    ("gpt", GPT, "mbs=2,pp=1,dp=1,tp=1", "one"),
    ("gpt.tp2", GPT, "mbs=2,pp=1,dp=1,tp=2,sp=0", "cpu:1"),
    ("gpt.tp2.sp", GPT, "mbs=2,pp=1,dp=1,tp=2,sp=1", "cpu:1"),
    ("gpt.cp2", GPT, "mbs=2,pp=1,dp=1,cp=2", "cpu:1"),
    ("gpt.cp2.tp2.sp", GPT, "mbs=2,pp=1,dp=1,cp=2,tp=2,sp=1", "cpu:2"),
    ("gpt.selective", GPT, "mbs=2,pp=1,dp=1,tp=2,sp=0,recompute=selective", "cpu:1"),
    ("gpt.tp2.sp.selective", GPT, "mbs=2,pp=1,dp=1,tp=2,sp=1,recompute=selective", "cpu:1"),
    ("llama.gqa.tp2.sp.selective", LLAMA, "mbs=2,pp=1,dp=1,tp=2,sp=1,recompute=selective", "cpu:1"),
    ("gpt.cp2.selective", GPT, "mbs=2,pp=1,dp=1,cp=2,recompute=selective", "cpu:1"),
    ("gpt.elementwise", GPT, "mbs=2,pp=1,dp=1,tp=1,recompute=elementwise", "one"),
    ("gpt.tp2.sp.elementwise", GPT + ["--dropout", "0.1"], "mbs=2,pp=1,dp=1,tp=2,sp=1,recompute=elementwise", "cpu:1"),
    ("llama.gqa.elementwise", LLAMA, "mbs=2,pp=1,dp=1,tp=1,recompute=elementwise", "one"),
    ("llama.gqa.cp2.tp2.sp.elementwise", LLAMA, "mbs=2,pp=1,dp=1,cp=2,tp=2,sp=1,recompute=elementwise", "cpu:2"),
    ("llama.gqa.dp2.zero3.elementwise", LLAMA, "mbs=1,pp=1,dp=2,tp=1,zero=3,recompute=elementwise", "cpu:1"),
    ("gpt.dp2.zero3.elementwise", GPT, "mbs=1,pp=1,dp=2,tp=1,zero=3,recompute=elementwise", "cpu:1"),
    ("gpt.alternate", GPT, "mbs=2,pp=1,dp=1,tp=1,recompute=alternate", "one"),
    ("llama.gqa.alternate", LLAMA, "mbs=2,pp=1,dp=1,tp=1,recompute=alternate", "one"),
    ("gpt.tp2.alternate", GPT, "mbs=2,pp=1,dp=1,tp=2,sp=0,recompute=alternate", "cpu:1"),
    ("gpt.tp2.sp.alternate", GPT + ["--dropout", "0.1"], "mbs=2,pp=1,dp=1,tp=2,sp=1,recompute=alternate", "cpu:1"),
    ("llama.gqa.tp2.sp.alternate", LLAMA, "mbs=2,pp=1,dp=1,tp=2,sp=1,recompute=alternate", "cpu:1"),
    # The arena packs this one's 4-layer step 5 KiB looser than its 2- and
    # 6-layer steps: its growth is taken over 4 layers.
    ("llama.gqa.cp2.tp2.sp.alternate", LLAMA, "mbs=2,pp=1,dp=1,cp=2,tp=2,sp=1,recompute=alternate", "cpu:2", 6),
    ("llama.gqa.dp2.zero3.alternate", LLAMA, "mbs=1,pp=1,dp=2,tp=1,zero=3,recompute=alternate", "cpu:1"),
    ("llama.gqa.cp2.tp2.sp.selective", LLAMA, "mbs=2,pp=1,dp=1,cp=2,tp=2,sp=1,recompute=selective", "cpu:2"),
    ("gpt.dropout", GPT + ["--dropout", "0.1"], "mbs=2,pp=1,dp=1,tp=1", "one"),
    ("gpt.bf16", GPT + ["--dtype", "bf16"], "mbs=2,pp=1,dp=1,tp=1", "one"),
    ("llama.gqa", LLAMA, "mbs=2,pp=1,dp=1,tp=1", "one"),
    ("llama.gqa.tp2", LLAMA, "mbs=2,pp=1,dp=1,tp=2,sp=0", "cpu:1"),
    ("llama.gqa.tp2.sp", LLAMA, "mbs=2,pp=1,dp=1,tp=2,sp=1", "cpu:1"),
]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if p.returncode != 0:
        sys.exit("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd),
                                                    p.stdout, p.stderr))
    return p.stdout


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def scratch_peak(exe, args):
    """The largest scratch peak over the executable's rank programs."""
    out = run([os.path.join(args.bin, "dlopt-run"), exe, "--dump"])
    peaks = [float(v) * UNITS[u] for v, u in
             re.findall(r"scratch peak: ([0-9.]+) (B|KiB|MiB|GiB) live", out)]
    if not peaks:
        sys.exit("no scratch peak in the dump of " + exe)
    return max(peaks)


def measure(name, gen, fix, cluster, layers, args):
    if cluster == "one":  # a single CPU device
        cluster = os.path.join(args.work_dir, "one.yaml")
        with open(cluster, "w") as f:
            f.write("nodes: 1\ngpus_per_node: 1\ngpu: cpu-device\n")
    base = os.path.join(args.work_dir, "%s.%d" % (name, layers))
    run([os.path.join(args.bin, "dlopt-gen")] + gen +
        ["--layers", str(layers), "-q", "-o", base + ".mlir"])
    compile_ = [os.path.join(args.bin, "dlopt-compile"), base + ".mlir",
                "--train", "--cluster", cluster, "--fix", fix]
    run(compile_ + ["-o", base + ".exe"])
    report = json.loads(run(compile_ + ["--dry-run", "--format", "json"]))
    mem = report["report"]["memory"]
    return scratch_peak(base + ".exe", args), mem["activations"] + mem["transient"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="")
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    if not args.bin:
        found = shutil.which("dlopt-compile")
        if not found:
            sys.exit("dlopt-compile is not on PATH; give --bin DIR")
        args.bin = os.path.dirname(found)
    os.makedirs(args.work_dir, exist_ok=True)
    failed = 0
    for name, gen, fix, cluster, *deeper in CASES:
        if args.only and args.only not in name:
            continue
        depth = deeper[0] if deeper else 4
        d2, p2 = measure(name, gen, fix, cluster, 2, args)
        d4, p4 = measure(name, gen, fix, cluster, depth, args)
        dlopt, planner = (d4 - d2) / (depth - 2), (p4 - p2) / (depth - 2)
        ratio = planner / dlopt if dlopt > 0 else float("inf")
        ok = 0.995 <= ratio <= 1.02
        failed += not ok
        print("%-18s per layer: dlopt %9.1f KiB, planner %9.1f KiB, "
              "ratio %.4f %s" % (name, dlopt / 1024, planner / 1024, ratio,
                                 "ok" if ok else "FAIL (expected 0.995-1.02)"))
    if failed:
        sys.exit("%d case(s) outside the bound" % failed)
    print("all cases within the bound")


if __name__ == "__main__":
    main()
