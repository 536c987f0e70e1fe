#!/usr/bin/env python3
"""Process layouts, sharded checkpoints and failures of multi-rank jobs
(docs/launch.md), under `mpirun --oversubscribe` on this machine.

1. layouts: each plan runs in-graph (threads of one process), between-graph
   (`mpirun -n N dlopt-run`, one rank per process) and hybrid (`mpirun -n
   N/2 dlopt-run --devices-per-process 2`). Every output of one step and the
   params, losses and gradient norms of 3 training steps must be equal bit
   for bit across the layouts: the collectives reduce in rank order
   whatever carries them.
2. resharding: train 4 steps under one plan and layout, checkpoint, resume
   under another plan and layout for 4 more; the losses of steps 5-8 match
   an uninterrupted single-device run (relative 1e-5: only the reduction
   order of the plans differs), across several pairs of plans, both ways
   between sharded directories and single files.
3. bad checkpoints are refused before anything runs: a missing or truncated
   shard, a missing index (a write that never finished), a corrupt shard,
   another model's checkpoint.
4. failures end the job with a message naming the failed rank: kill -9 of
   one process mid-training, a process that fails (the others report what
   they were waiting for), a stopped process (the others time out).
5. bad launches: a world size that differs from the executable's,
   --devices-per-process that does not divide the ranks.

  check_launch.py [--work-dir DIR] [--only SUBSTRING] [--launcher mpirun|srun]

--launcher srun runs the same tests under Slurm's srun (a running cluster,
e.g. scripts/local-slurm.sh, with SLURM_CONF set).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check_parallel import tool, run  # noqa: E402

_print = print


def print(*args, **kwargs):  # noqa: A001
    """print, and a FAIL line goes to stderr as well: lit shows a failed
    test's stderr whole, where FileCheck's dump of stdout elides the middle
    (a CI failure of the srun variant hid its FAIL line that way)."""
    _print(*args, **kwargs)
    if args and isinstance(args[0], str) and args[0].startswith("FAIL"):
        _print(*args, file=sys.stderr)
    sys.stdout.flush()


ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
MPIRUN = shutil.which("mpirun")

GPT = ["gpt", "--preset", "gpt-tiny", "--layers", "4", "--batch", "4"]
LLAMA = ["llama", "--preset", "llama-tiny", "--layers", "4", "--batch", "4"]
MLP = ["mlp", "--preset", "mlp-tiny", "--layers", "8", "--batch", "4"]
FLAGS = ["--optimizer", "adamw", "--lr", "0.01", "--clip-norm", "0.5", "--adam-eps", "1e-3",
         "--accumulate", "4"]

# name, model, --fix
LAYOUT_CASES = [
    ("gpt.dp2.tp2", GPT, "dp=2,tp=2"),
    ("gpt.pp2.dp2.zero1.1f1b", GPT, "pp=2,dp=2,zero=1,schedule=1f1b"),
    ("gpt.dp2.zero3", GPT, "dp=2,zero=3"),
    ("gpt.dp2.cp2", GPT, "dp=2,cp=2"),
    ("llama.pp2.tp2.sp.selective.interleaved", LLAMA,
     "pp=2,tp=2,sp=1,recompute=selective,schedule=interleaved,v=2"),
    ("mlp.pp4.zero-bubble", MLP, "pp=4,schedule=zero-bubble"),
    ("mlp.pp2.dp2.zero2.gpipe", MLP, "pp=2,dp=2,zero=2,schedule=gpipe"),
]


# --launcher srun: the same tests under Slurm's srun (a running cluster,
# e.g. scripts/local-slurm.sh; SLURM_CONF in the environment).
LAUNCHER = "mpirun"


def launch_cmd(n):
    if LAUNCHER == "srun":
        return ["srun", "-n", str(n), "--overcommit", "--kill-on-bad-exit=1"]
    return [MPIRUN, "-n", str(n), "--oversubscribe"]


# Every launcher runs in a session of its own: a launcher that ends a job
# (a failed rank, MPI_Abort, a timeout) signals its processes, and must not
# reach this script. Twice a loaded CI host saw this script end silently,
# without its summary, during the launches that end a job on purpose.
LAUNCH_KW = {"start_new_session": True}


def mpirun(n, args, timeout=300):
    return subprocess.run(launch_cmd(n) + args, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, **LAUNCH_KW)


class Tools:
    def __init__(self):
        self.gen, self.comp, self.runp = tool("dlopt-gen"), tool("dlopt-compile"), tool("dlopt-run")

    def model(self, genargs, d, name="m.mlir"):
        path = os.path.join(d, name)
        r = run([self.gen] + genargs + ["-q", "-o", path])
        if r.returncode:
            raise RuntimeError("dlopt-gen: " + r.stderr)
        return path

    def compile(self, model, fix, out, cluster="cpu:2"):
        cmd = [self.comp, model, "--train", "--quiet", "-o", out, "--cluster", cluster] + FLAGS
        if fix:
            cmd += ["--fix", fix]
        r = run(cmd)
        if r.returncode:
            raise RuntimeError("compile (%s): %s" % (fix, r.stderr))
        return out

    def ranks(self, exe):
        head = run([self.runp, exe, "--dump"]).stdout
        m = re.search(r"world size: (\d+)", head)
        if not m:
            raise RuntimeError("no world size in: " + head[:300])
        return int(m.group(1))

    def launch(self, exe, layout, args, timeout=300):
        """Runs dlopt-run on exe in a layout: 'in-graph', 'between' or 'hybrid'."""
        n = self.ranks(exe)
        cmd = [self.runp, exe] + args
        if layout == "in-graph":
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout, **LAUNCH_KW)
        elif layout == "between":
            r = mpirun(n, cmd, timeout)
        else:
            r = mpirun(n // 2, cmd + ["--devices-per-process", "2"], timeout)
        if r.returncode:
            raise RuntimeError("dlopt-run %s (%s): rc %d: %s" % (os.path.basename(exe), layout,
                                                                 r.returncode, r.stderr[-1500:]))
        return r


def tokens(d, rng):
    p = os.path.join(d, "tokens.npy")
    np.save(p, rng.integers(0, 64, 20000).astype(np.int32))
    return p


def same_files(a, b):
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    if fa != fb:
        raise RuntimeError("different files: %s vs %s" % (fa, fb))
    for f in fa:
        x, y = np.load(os.path.join(a, f)), np.load(os.path.join(b, f))
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            raise RuntimeError("%s differs" % f)
    return len(fa)


def metrics(path, keys=("step", "loss", "grad_norm")):
    return [tuple(json.loads(l)[k] for k in keys) for l in open(path)]


def layouts(t, work, rng, only):
    passed = failed = 0
    # Under srun, a subset: the launcher-independent checks ran under mpirun.
    for name, genargs, fix in (LAYOUT_CASES[:3] if LAUNCHER == "srun" else LAYOUT_CASES):
        if only and only not in name:
            continue
        d = os.path.join(work, "layout." + name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        try:
            model = t.model(genargs, d)
            exe = t.compile(model, fix, os.path.join(d, "p.exe"))
            # Token data for transformers; arrays for the mlp (each
            # process reads only the samples its ranks hold).
            data = (["--data", tokens(d, rng)] if genargs[0] != "mlp"
                    else arrays(t, exe, d, rng))
            outs, ran = {}, []
            for lay in ("in-graph", "between", "hybrid"):
                if lay == "hybrid" and t.ranks(exe) % 2:
                    continue
                o = os.path.join(d, lay)
                # One step's outputs on fresh inputs (the data's first batch).
                t.launch(exe, lay, ["--quiet", "--seed", "7", "--steps", "3", "--save-params",
                                    o + ".params", "--metrics", o + ".jsonl"] + data)
                outs[lay] = o
                ran.append(lay)
            ref = outs["in-graph"]
            n = 0
            for lay in ran[1:]:
                n = same_files(ref + ".params", outs[lay] + ".params")
                if metrics(ref + ".jsonl") != metrics(outs[lay] + ".jsonl"):
                    raise RuntimeError("%s: losses or gradient norms differ: %s vs %s" % (
                        lay, metrics(ref + ".jsonl"), metrics(outs[lay] + ".jsonl")))
            # One step with every output (no updates applied).
            for lay in ran:
                t.launch(exe, lay, ["--quiet", "--seed", "7", "--output-dir",
                                    outs[lay] + ".outputs"] + one_step_inputs(t, exe, d, rng))
            for lay in ran[1:]:
                same_files(ref + ".outputs", outs[lay] + ".outputs")
            print("PASS layout.%s: %s bit for bit (%d params after 3 steps, losses, grad norms, "
                  "every output of one step)" % (name, " = ".join(ran), n))
            passed += 1
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print("FAIL layout.%s: %s" % (name, str(e)[:1500]))
            failed += 1
    return passed, failed


def arrays(t, exe, d, rng):
    """--data-input flags: 3 steps' worth of samples for each input of exe,
    whose inputs are [K, B, ...] (FLAGS accumulate K micro-batches)."""
    binds = []
    for line in run([t.runp, exe, "--dump"]).stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[1] == "input":
            typ = f[f.index("global") + 1] if "global" in f else f[3]
            dims, dt = [int(x) for x in typ.split("x")[:-1]], typ.split("x")[-1]
            shape = (3 * dims[0] * dims[1],) + tuple(dims[2:])
            a = (rng.standard_normal(shape).astype(np.float32) if dt == "f32"
                 else rng.integers(0, 4, shape).astype(np.int64))
            p = os.path.join(d, "data." + f[2] + ".npy")
            np.save(p, a)
            binds += ["--data-input", "%s=%s" % (f[2], p)]
    return binds


_inputs = {}


def one_step_inputs(t, exe, d, rng):
    """--input flags binding fresh random global inputs of exe."""
    if exe in _inputs:
        return _inputs[exe]
    binds = []
    for line in run([t.runp, exe, "--dump"]).stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[1] == "input":
            typ = f[f.index("global") + 1] if "global" in f else f[3]
            dims, dt = typ.split("x")[:-1], typ.split("x")[-1]
            shape = tuple(int(x) for x in dims)
            a = (rng.standard_normal(shape).astype(np.float32) if dt == "f32"
                 else rng.integers(0, 4, shape).astype(np.int32))
            p = os.path.join(d, f[2] + ".npy")
            np.save(p, a)
            binds += ["--input", "%s=%s" % (f[2], p)]
    _inputs[exe] = binds
    return binds


# (name, first plan, first layout, second plan, second layout); plans are
# --fix strings ("" = one device).
RESHARD_CASES = [
    ("dp2.tp2.in-graph->pp2.dp2.between", "dp=2,tp=2", "in-graph", "pp=2,dp=2,zero=1,schedule=1f1b", "between"),
    ("pp2.dp2.between->one-device", "pp=2,dp=2,zero=1,schedule=1f1b", "between", "", "single"),
    ("one-device->dp2.zero3.hybrid", "", "single", "dp=2,zero=3", "hybrid"),
    ("dp2.zero3.between->tp2.cp2.in-graph", "dp=2,zero=3", "between", "tp=2,cp=2", "in-graph"),
    ("pp2.tp2.hybrid->dp4.zero2.between", "pp=2,tp=2,schedule=interleaved,v=2", "hybrid", "dp=4,zero=2", "between"),
    # The same plan: every block is read straight into the ranks' memory.
    ("dp2.tp2.between->dp2.tp2.hybrid", "dp=2,tp=2", "between", "dp=2,tp=2", "hybrid"),
]


def reshard(t, work, rng, only):
    passed = failed = 0
    d0 = os.path.join(work, "reshard")
    shutil.rmtree(d0, ignore_errors=True)
    os.makedirs(d0)
    model = t.model(GPT, d0)
    data = tokens(d0, rng)
    exes = {}

    def exe_for(fix):
        if fix not in exes:
            exes[fix] = t.compile(model, fix or "dp=1", os.path.join(d0, "p%d.exe" % len(exes)))
        return exes[fix]

    if only and not any(only in c[0] for c in RESHARD_CASES):
        return 0, 0, exe_for, model, data
    common = ["--quiet", "--data", data]
    full = os.path.join(d0, "full.jsonl")
    r = run([t.runp, exe_for(""), "--steps", "8", "--metrics", full] + common)
    if r.returncode:
        raise RuntimeError(r.stderr)
    want = metrics(full)[4:]
    for name, fa, la, fb, lb in (RESHARD_CASES[:2] if LAUNCHER == "srun" else RESHARD_CASES):
        if only and only not in name:
            continue
        d = os.path.join(d0, name)
        os.makedirs(d)
        try:
            ck = os.path.join(d, "ck")
            la_ = "in-graph" if la == "single" else la
            lb_ = "in-graph" if lb == "single" else lb
            t.launch(exe_for(fa), la_, common + ["--steps", "4", "--checkpoint-dir", ck])
            saved = os.listdir(ck)
            point = os.path.join(ck, saved[0])
            kind = "file" if point.endswith(".safetensors") else "sharded"
            m = os.path.join(d, "resumed.jsonl")
            t.launch(exe_for(fb), lb_, common + ["--steps", "4", "--resume", point, "--metrics", m])
            got = metrics(m)
            worst = 0.0
            for (s1, l1, g1), (s2, l2, g2) in zip(want, got):
                if s1 != s2:
                    raise RuntimeError("step %d vs %d" % (s1, s2))
                worst = max(worst, abs(l1 - l2) / abs(l1), abs(g1 - g2) / abs(g1))
            if len(got) != 4 or worst > 1e-5:
                raise RuntimeError("steps 5-8 differ from an uninterrupted run: %s vs %s" % (got, want))
            print("PASS reshard.%s: %s checkpoint, steps 5-8 within %.2g of one device's "
                  "uninterrupted run" % (name, kind, worst))
            passed += 1
        except (RuntimeError, subprocess.TimeoutExpired, IndexError) as e:
            print("FAIL reshard.%s: %s" % (name, str(e)[:1500]))
            failed += 1
    return passed, failed, exe_for, model, data


def bad_checkpoints(t, work, exes, model, data):
    """A broken sharded checkpoint is refused before training starts."""
    passed = failed = 0
    d = os.path.join(work, "badck")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    exe = exes("dp=2,tp=2")
    ck = os.path.join(d, "ck")
    # A killed writer's staging directory is removed by the next writer.
    stale = os.path.join(ck, "step-000001.tmp")
    os.makedirs(stale)
    open(os.path.join(stale, "rank-00000.safetensors"), "wb").write(b"x" * 1000)
    t.launch(exe, "in-graph", ["--quiet", "--data", data, "--steps", "2", "--checkpoint-dir", ck])
    good = os.path.join(ck, "step-000002")
    if os.path.exists(stale) or sorted(os.listdir(ck)) != ["step-000002"]:
        print("FAIL bad_checkpoint.stale_staging: %s" % sorted(os.listdir(ck)))
        failed += 1
    else:
        print("PASS bad_checkpoint.stale_staging: a killed writer's step-000001.tmp was removed")
        passed += 1
    other = os.path.join(d, "other")
    os.makedirs(other)
    omodel = t.model(MLP, other)
    oexe = t.compile(omodel, "dp=2", os.path.join(other, "o.exe"))
    t.launch(oexe, "in-graph", ["--quiet", "--steps", "1", "--checkpoint-dir", os.path.join(other, "ck")])

    def broken(name, edit, expect):
        nonlocal passed, failed
        b = os.path.join(d, name)
        shutil.copytree(good, b)
        edit(b)
        m = os.path.join(d, name + ".jsonl")
        r = run([t.runp, exe, "--quiet", "--data", data, "--steps", "1", "--resume", b, "--metrics", m])
        if r.returncode == 1 and re.search(expect, r.stderr) and not os.path.exists(m):
            print("PASS bad_checkpoint.%s: %s" % (name, r.stderr.strip().splitlines()[-1][:220]))
            passed += 1
        else:
            print("FAIL bad_checkpoint.%s: rc %d, expected /%s/, got: %s" % (name, r.returncode, expect,
                                                                            r.stderr[-600:]))
            failed += 1

    def truncate(b):
        p = os.path.join(b, "rank-00001.safetensors")
        data_ = open(p, "rb").read()
        open(p, "wb").write(data_[: len(data_) // 2])

    def corrupt(b):
        p = os.path.join(b, "rank-00000.safetensors")
        data_ = bytearray(open(p, "rb").read())
        data_[8:16] = b"\x00" * 8  # the JSON header's first bytes
        open(p, "wb").write(bytes(data_))

    def other_model(b):
        shutil.rmtree(b)
        shutil.copytree(os.path.join(other, "ck", "step-000001"), b)

    broken("missing_shard", lambda b: os.remove(os.path.join(b, "rank-00001.safetensors")),
           r"shard rank-00001.safetensors is missing")
    broken("truncated_shard", truncate, r"rank-00001.safetensors has \d+ bytes, the index says \d+")
    broken("unfinished_write", lambda b: os.remove(os.path.join(b, "index.json")),
           r"no index.json .*never finished")
    broken("corrupt_shard", corrupt, r"rank-00000.safetensors")
    broken("other_model", other_model, r"does not match this model")
    def drop_block(b):
        p = os.path.join(b, "index.json")
        ix = json.load(open(p))
        name = next(n for n, t in ix["tensors"].items() if len(t["blocks"]) > 1)
        ix["tensors"][name]["blocks"].pop()
        json.dump(ix, open(p, "w"))

    broken("dropped_block", drop_block, r"its blocks cover \d+ of its \d+ elements")
    broken("bad_index", lambda b: open(os.path.join(b, "index.json"), "w").write("{\"format\": 3"),
           r"index.json is not valid JSON")
    return passed, failed


def pid_of_rank(path, rank):
    """The dlopt-run process of `rank` among those whose command line has
    `path`, this test's own copy of the executable (its full path: the
    mpirun and srun variants of this test may run at once, with copies of
    the same name in other work directories, and stopping the other job's
    rank left this job training until the test timed out). Only a process
    whose executable is dlopt-run and that carries this launcher's rank
    variable counts: the launcher's own processes carry the path too."""
    var = "SLURM_PROCID" if LAUNCHER == "srun" else "OMPI_COMM_WORLD_RANK"
    for p in subprocess.run(["pgrep", "-f", re.escape(path)], stdout=subprocess.PIPE, text=True).stdout.split():
        try:
            exe = os.readlink("/proc/%s/exe" % p)
            env = open("/proc/%s/environ" % p, "rb").read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(exe).split(" ")[0] != "dlopt-run":
            continue
        if ("%s=%d" % (var, rank)).encode() in env:
            return int(p)
    return None


def describe_processes(pattern):
    """pid, state and executable of every process matching `pattern`, for
    failure messages."""
    rows = []
    for p in subprocess.run(["pgrep", "-f", re.escape(pattern)], stdout=subprocess.PIPE,
                            text=True).stdout.split():
        try:
            exe = os.readlink("/proc/%s/exe" % p)
            state = [l for l in open("/proc/%s/status" % p) if l.startswith("State:")][0].split(None, 1)[1].strip()
            env = open("/proc/%s/environ" % p, "rb").read().split(b"\0")
            rank = [e.decode() for e in env if e.startswith(b"SLURM_PROCID=") or e.startswith(b"OMPI_COMM_WORLD_RANK=")]
        except (OSError, IndexError):
            continue
        rows.append("%s %s %s %s" % (p, state, os.path.basename(exe), ",".join(rank)))
    return "; ".join(rows)


def failures(t, work, exes, data):
    passed = failed = 0
    exe = exes("dp=2,tp=2")
    # A copy with its own name in this run's work directory, so pgrep finds
    # only this job's processes (by the full path: see pid_of_rank).
    d = os.path.join(work, "failures")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    job = os.path.join(d, "victim-job.exe")
    shutil.copy(exe, job)
    base = [t.runp, job, "--quiet", "--data", data, "--comm-timeout", "20"]

    # kill -9 of rank 1 mid-training: the launcher ends the job; every other
    # process says what it was waiting for. It is killed once training runs
    # (the first step's metrics line is written): a fixed wait after the
    # process appeared could land in start-up on a loaded host.
    kill_metrics = os.path.join(d, "victim-job.jsonl")
    p = subprocess.Popen(launch_cmd(4) + base + ["--steps", "1000000", "--metrics", kill_metrics],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         **LAUNCH_KW)
    pid = None
    for _ in range(600):
        time.sleep(0.1)
        pid = pid or pid_of_rank(job, 1)
        if pid and os.path.exists(kill_metrics) and os.path.getsize(kill_metrics) > 0:
            break
    t0 = time.time()
    try:
        if pid is None:
            raise RuntimeError("rank 1's process never appeared")
        if not (os.path.exists(kill_metrics) and os.path.getsize(kill_metrics) > 0):
            raise RuntimeError("the job wrote no step within 60 s")
        os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        secs = time.time() - t0
        waits = re.findall(r"\(process (\d) of 4 on [^)]*\) terminated by the launcher .* while "
                           r"(waiting in \S+|computing)", err)
        named = re.search(r"process rank 1 .*(signal 9|Killed)|task 1: Killed", err)
        if p.returncode == 0 or not named or len(waits) < 1:
            raise RuntimeError("rc %d, %.1f s: %s" % (p.returncode, secs, err[-1500:]))
        print("PASS failure.kill9: the job ended %.1f s after kill -9 of rank 1 (rc %d); the "
              "launcher named rank 1; %d other process(es) said what they were doing: %s"
              % (secs, p.returncode, len(waits), sorted(set(w[1] for w in waits))))
        passed += 1
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        p.kill()
        print("FAIL failure.kill9: %s" % str(e)[:1500])
        failed += 1

    # A process that fails (process 1 cannot read its checkpoint) while the
    # others train: they stop waiting, name it and say where they waited.
    t0 = time.time()
    bad = base + ["--steps", "50", "--resume", os.path.join(d, "nowhere")]
    if LAUNCHER == "srun":
        conf = os.path.join(d, "multi.conf")
        with open(conf, "w") as f:
            f.write("0,2,3 %s\n1 %s\n" % (" ".join(base + ["--steps", "50"]), " ".join(bad)))
        cmd = launch_cmd(4) + ["--multi-prog", conf]
    else:
        cmd = [MPIRUN, "--oversubscribe", "-n", "1"] + base + ["--steps", "50", ":", "-n", "1"] + \
            bad + [":", "-n", "2"] + base + ["--steps", "50"]
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120, **LAUNCH_KW)
    secs = time.time() - t0
    others = re.findall(r"\(process (\d) of 4 on [^)]*\) .*?(\w+ \(rank \d of a group of \d, MPI\)): "
                        r"aborted: process 1 of 4 on \S+ failed", r.stderr)
    if r.returncode != 0 and "(process 1 of 4" in r.stderr and "nowhere" in r.stderr and \
            sorted(set(o[0] for o in others)) == ["0", "2", "3"]:
        print("PASS failure.rank_error: process 1 failed; processes 0, 2, 3 ended in %.1f s naming it "
              "and what they waited in: %s" % (secs, sorted(set(o[1].split(" ")[0] for o in others))))
        passed += 1
    else:
        print("FAIL failure.rank_error: rc %d, %.1f s: %s" % (r.returncode, secs, r.stderr[-2000:]))
        failed += 1

    # A stopped process: nobody kills it, the others time out. It is
    # stopped once training runs (the first step's metrics line is
    # written), not during start-up.
    stopped = os.path.join(d, "stopped-job.exe")
    shutil.copy(exes("dp=2,zero=3"), stopped)
    metrics = os.path.join(d, "stopped-job.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    seen = ""
    p = subprocess.Popen(launch_cmd(2) + [t.runp,
                          stopped, "--quiet", "--data", data,
                          "--devices-per-process", str(t.ranks(stopped) // 2),
                          "--comm-timeout", "3", "--steps", "1000000", "--metrics", metrics],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         **LAUNCH_KW)
    try:
        pid = None
        for _ in range(600):
            time.sleep(0.1)
            pid = pid or pid_of_rank(stopped, 1)
            if pid and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
                break
        if pid is None:
            raise RuntimeError("rank 1's process never appeared")
        if not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
            raise RuntimeError("the job wrote no step within 60 s")
        t0 = time.time()
        os.kill(pid, signal.SIGSTOP)
        seen = describe_processes("stopped-job.exe")
        out, err = p.communicate(timeout=60)
        secs = time.time() - t0
        if p.returncode == 0 or "timed out after 3" not in err or "(process 0 of 2" not in err:
            raise RuntimeError("rc %d, %.1f s: %s" % (p.returncode, secs, err[-1500:]))
        print("PASS failure.stopped_rank: process 0 timed out %.1f s after rank 1 stopped: %s"
              % (secs, [l for l in err.splitlines() if "timed out" in l][0][:200]))
        if os.environ.get("CHECK_LAUNCH_VERBOSE"):
            print("  processes when rank 1 (pid %s) was stopped: %s" % (pid, seen))
        passed += 1
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        p.kill()
        try:
            _, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            err = "(the launcher did not end after kill)"
        print("FAIL failure.stopped_rank: %s; stderr: %s; processes when stopped (pid %s): %s; now: %s" % (
            str(e)[:1500], (err or "")[-1500:], pid, seen, describe_processes("stopped-job.exe")))
        failed += 1
    finally:
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return passed, failed


def bad_launches(t, exes, data):
    passed = failed = 0
    exe = exes("dp=2,tp=2")
    # A bad id in the last process's share of the load-time check: every
    # process stops with the message of the process that found it.
    bad = os.path.join(os.path.dirname(data), "bad-tokens.npy")
    ids = np.load(data)
    ids[19000] = 1000000
    np.save(bad, ids)
    cases = [
        ("data_share", mpirun(4, [t.runp, exe, "--quiet", "--steps", "1", "--data", bad]),
         r"\(process 0 of 4 on [^)]*\) --data [^:]*: process 3: [^:]*: token 1000000 at "
         r"position 19000 is outside the model's vocabulary"),
        ("world_size", mpirun(3, [t.runp, exe, "--quiet"]),
         r"the launcher started 3 processes x 1 rank\(s\) per process = 3 ranks, but the executable has 4"),
        ("devices_per_process", mpirun(2, [t.runp, exe, "--quiet", "--devices-per-process", "3"]),
         r"--devices-per-process 3 does not divide the executable's 4 ranks"),
        ("hybrid_world_size", mpirun(3, [t.runp, exe, "--quiet", "--devices-per-process", "2"]),
         r"3 processes x 2 rank\(s\) per process = 6 ranks, but the executable has 4; start 2 processes"),
    ]
    for name, r, expect in cases:
        if r.returncode != 0 and re.search(expect, r.stderr):
            print("PASS bad_launch.%s: %s" % (name, re.search(expect, r.stderr).group(0)))
            passed += 1
        else:
            print("FAIL bad_launch.%s: rc %d: %s" % (name, r.returncode, r.stderr[-800:]))
            failed += 1
    return passed, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work-dir")
    ap.add_argument("--only")
    ap.add_argument("--launcher", choices=("mpirun", "srun"), default="mpirun")
    ap.add_argument("--start-slurm", metavar="DIR",
                    help="start a one-node Slurm cluster in DIR for the run "
                    "(scripts/local-slurm.sh; root) and stop it afterwards")
    args = ap.parse_args()
    global LAUNCHER
    LAUNCHER = args.launcher
    if LAUNCHER == "srun" and not shutil.which("srun"):
        print("SKIP: no srun")
        return 0
    if args.start_slurm:
        script = os.path.join(HERE, "..", "..", "scripts", "local-slurm.sh")
        r = subprocess.run([script, "start", args.start_slurm], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode:
            print("FAIL slurm: could not start a local cluster: " + r.stderr[-1500:])
            return 1
        ENV["SLURM_CONF"] = r.stdout.strip().split("=", 1)[1]
        try:
            return run_all(args)
        finally:
            subprocess.run([script, "stop", args.start_slurm])
    return run_all(args)


def run_all(args):
    if not MPIRUN:
        print("SKIP: no mpirun (install openmpi-bin)")
        return 0
    seed = int.from_bytes(os.urandom(4), "little")
    print("seed %d" % seed)
    rng = np.random.default_rng(seed)
    work = args.work_dir or tempfile.mkdtemp(prefix="dlopt_launch_")
    os.makedirs(work, exist_ok=True)
    t = Tools()
    total = [0, 0]

    def add(pf):
        total[0] += pf[0]
        total[1] += pf[1]

    def section(name, fn, *a):
        # A section that raises counts as one failure and the run goes on,
        # so the summary line always comes.
        try:
            return fn(*a)
        except Exception:
            print("FAIL %s: %s" % (name, traceback.format_exc()[-1500:]))
            sys.stdout.flush()
            return None

    add(section("layouts", layouts, t, work, rng, args.only) or (0, 1))
    r = section("reshard", reshard, t, work, rng, args.only)
    if r is None:
        add((0, 1))
        print("%d passed, %d failed" % tuple(total))
        return 1
    p, f, exes, model, data = r
    add((p, f))
    if (not args.only or "bad_checkpoint" in args.only) and LAUNCHER != "srun":
        add(section("bad_checkpoint", bad_checkpoints, t, work, exes, model, data) or (0, 1))
    if not args.only or "failure" in args.only:
        add(section("failure", failures, t, work, exes, data) or (0, 1))
    if not args.only or "bad_launch" in args.only:
        add(section("bad_launch", bad_launches, t, exes, data) or (0, 1))
    print("%d passed, %d failed" % tuple(total))
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main())
