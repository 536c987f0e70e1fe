#!/usr/bin/env python3
"""The training loop over multi-rank executables (ranks as threads): losses
of `dlopt-run --steps` on a parallel executable equal the single-device
run's on the same data and seed, and checkpoints (one file of global
tensors from one device, a sharded directory from a parallel run) resume
in any layout (parallel -> one device, one device -> parallel, parallel ->
parallel) exactly where an uninterrupted run would be.

Losses must agree to 1e-5 relative (float32, sums in another order, a few
SGD steps). Prints PASS/FAIL lines and "N passed, M failed".

  check_parallel_training.py [--work-dir DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

TOL = 1e-5
HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "examples", "data", "corpus.npy")


def tool(name):
    for d in os.environ.get("PATH", "").split(os.pathsep) + [os.path.join(HERE, "..", "..", "build", "bin")]:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    sys.exit("check_parallel_training.py: %s not found" % name)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise RuntimeError("%s: %s" % (" ".join(os.path.basename(c) for c in cmd[:2]), r.stderr.strip()[:500]))
    return r


def losses(path):
    with open(path) as f:
        return [json.loads(l)["loss"] for l in f]


def close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= TOL * max(abs(y), 1e-6) for x, y in zip(a, b))


CASES = [
    # name, dlopt-gen args, compile flags, --fix, cluster, data flags[,
    # (another --fix, its cluster): the checkpoints also resume there]
    ("mlp.sgd.dp2", ["mlp", "--preset", "mlp-tiny", "--batch", "8"],
     ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9"], "dp=2", "cpu:1", []),
    ("gpt.sgd.dp2.tp2.sp", ["gpt", "--preset", "gpt-tiny", "--batch", "4"],
     ["--optimizer", "sgd", "--lr", "0.1", "--clip-norm", "1"], "dp=2,tp=2,sp=1", "cpu:2",
     ["--data", CORPUS]),
    # ZeRO: several AdamW steps with clipping; the sharded optimizer state
    # is checkpointed as global tensors and resumes under another ZeRO
    # stage and layout.
    ("mlp.adamw.clip.dp4.zero2", ["mlp", "--preset", "mlp-tiny", "--batch", "8"],
     ["--optimizer", "adamw", "--lr", "0.01", "--clip-norm", "0.1", "--adam-eps", "1e-3"],
     "dp=4,zero=2", "cpu:2", [], ("dp=2,zero=3", "cpu:1")),
    ("gpt.adamw.clip.dp2.tp2.zero3", ["gpt", "--preset", "gpt-tiny", "--batch", "4"],
     ["--optimizer", "adamw", "--lr", "0.001", "--clip-norm", "1"], "dp=2,tp=2,zero=3", "cpu:2",
     ["--data", CORPUS], ("dp=2,zero=1", "cpu:1")),
    # Pipeline stages: several AdamW steps with clipping over 2 micro-batches
    # per step; the stages' checkpoints hold global tensors too and resume
    # without stages, and the reverse.
    ("gpt.adamw.clip.pp2.dp2.zero1", ["gpt", "--preset", "gpt-tiny", "--batch", "4"],
     ["--optimizer", "adamw", "--lr", "0.001", "--clip-norm", "1", "--accumulate", "2"],
     "pp=2,dp=2,zero=1,schedule=1f1b", "cpu:2", ["--data", CORPUS], ("dp=2,tp=2", "cpu:2")),
    ("gpt.sgd.pp2.tp2.sp.zb", ["gpt", "--preset", "gpt-tiny", "--layers", "4", "--batch", "4"],
     ["--optimizer", "sgd", "--lr", "0.1", "--clip-norm", "1", "--accumulate", "2"],
     "pp=2,tp=2,sp=1,schedule=zero-bubble", "cpu:2", ["--data", CORPUS],
     ("pp=2,schedule=interleaved,v=2", "cpu:1")),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work-dir")
    args = ap.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="dlopt_ptrain_")
    gen, comp, runp = tool("dlopt-gen"), tool("dlopt-compile"), tool("dlopt-run")
    passed = failed = 0
    for case in CASES:
        name, genargs, flags, fix, cluster, data = case[:6]
        other = case[6] if len(case) > 6 else None
        d = os.path.join(work, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        try:
            m = os.path.join(d, "m.mlir")
            run([gen] + genargs + ["-q", "-o", m])
            one, par = os.path.join(d, "one.exe"), os.path.join(d, "par.exe")
            run([comp, m, "--train", "--quiet", "-o", one] + flags)
            run([comp, m, "--train", "--quiet", "-o", par, "--cluster", cluster, "--fix", fix] + flags)
            alt = os.path.join(d, "other.exe")
            if other:
                run([comp, m, "--train", "--quiet", "-o", alt, "--cluster", other[1], "--fix", other[0]] + flags)
            common = ["--seed", "3", "--quiet"] + data

            def train(exe, tag, steps, resume=None):
                cmd = [runp, exe, "--steps", str(steps), "--metrics", os.path.join(d, tag + ".jsonl"),
                       "--checkpoint-dir", os.path.join(d, tag)] + common
                if resume:
                    cmd += ["--resume", resume]
                run(cmd)
                return losses(os.path.join(d, tag + ".jsonl"))

            full = train(one, "full", 6)
            par6 = train(par, "par", 6)
            if not close(par6, full):
                raise RuntimeError("losses differ: parallel %s, one device %s" % (par6, full))
            # Checkpoints at step 3 of each layout, resumed in the others.
            train(one, "one3", 3)
            train(par, "par3", 3)
            ck_one = os.path.join(d, "one3", "step-000003.safetensors")
            ck_par = os.path.join(d, "par3", "step-000003")  # sharded
            resumes = [("par_to_one", one, ck_par), ("one_to_par", par, ck_one),
                       ("par_to_par", par, ck_par)]
            if other:
                resumes.append(("par_to_other", alt, ck_par))
            for tag, exe, ck in resumes:
                rest = train(exe, tag, 3, ck)
                if not close(rest, full[3:]):
                    raise RuntimeError("%s: resumed losses %s, uninterrupted %s" % (tag, rest, full[3:]))
            worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(par6, full))
            print("PASS %s: 6 steps, largest relative loss difference %.2g; checkpoints resume across layouts" % (name, worst))
            passed += 1
        except RuntimeError as e:
            print("FAIL %s: %s" % (name, str(e)[:600]))
            failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
