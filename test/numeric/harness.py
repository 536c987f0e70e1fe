"""The driver shared by the numeric suites (check_ops.py, check_grads.py,
check_optimizers.py, check_training.py, check_precision.py).

A suite is a list CASES of (name, fn) and a function
run_one(name, fn, args, tools, work) -> (ok, detail). main() parses the
common options (--work-dir, --seed, --filter, --bin-dir, --list and, for
backend suites, --backend), prints the seed and work dir, runs every
selected case printing one `PASS|FAIL name: detail` line per case, then
`N passed, M failed`, and returns the exit code (1 on any failure). The
work dir is removed on success when it was a fresh temp dir.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
import time
import zlib

import numpy as np

from dlopt_np import find_tool, run


class Failure(Exception):
    """A case failed; the message is its detail line."""


def case_rng(seed, name):
    """The per-case generator: the same seed and name give the same data."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def fresh_case_dir(work, name):
    """<work>/<name with odd characters replaced>, emptied."""
    d = os.path.join(work, re.sub(r"[^A-Za-z0-9_.-]", "_", name))
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    return d


def input_args(d, arrays):
    """Saves each (name, _, array) as <d>/<name>.npy; the dlopt-run
    `--input name=path` arguments binding them."""
    cmd = []
    for n, _, arr in arrays:
        p = os.path.join(d, n + ".npy")
        np.save(p, arr)
        cmd += ["--input", "%s=%s" % (n, p)]
    return cmd


class Ctx:
    """A case's context: its rng, a fresh directory, and the tools."""

    def __init__(self, name, seed, tools, work):
        self.name = name
        self.seed = seed
        self.rng = case_rng(seed, name)
        self.tools = tools
        self.work = work
        self.dir = fresh_case_dir(work, name)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def tool(self, which, args, timeout=300, check=True):
        r = run([self.tools[which]] + args, timeout=timeout)
        if check and r.returncode != 0:
            raise Failure("%s %s failed (rc %d): %s" % (
                os.path.basename(self.tools[which]), " ".join(args)[:200], r.returncode, r.stderr.strip()[-600:]))
        return r


def run_ctx_case(ctx, fn):
    """fn(ctx) returns the detail of a pass; a Failure fails the case."""
    try:
        return True, fn(ctx)
    except Failure as e:
        return False, str(e)


def main(prog, doc, cases, run_one, tmp_prefix, kept, tools=("compile", "run"), backend=False,
         item="case", timed=False, exc_filename=False, setup=None):
    """prog: the name in the header line; kept: what the work dir holds (printed
    on failure); tools: the dlopt-TOOL executables to find; item: "case" or
    "check" (help and the failure summary); timed: append each case's time;
    exc_filename: name an exception's file in a harness exception; setup(work):
    run once the work dir exists."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if backend:
        ap.add_argument("--backend", default="cpu", help="passed to dlopt-run --backend (default cpu)")
    ap.add_argument("--work-dir", help="scratch directory (default: a fresh temp dir, removed on success)")
    ap.add_argument("--seed", type=int, help="data seed (default: random, printed)")
    ap.add_argument("--filter", help="only %ss whose name matches this regex" % item)
    ap.add_argument("--bin-dir", help="directory of %s (default: PATH)" % (
        "dlopt-compile and dlopt-run" if tuple(tools) == ("compile", "run") else "the dlopt tools"))
    ap.add_argument("--list", action="store_true", help="list the %s names and exit" % item)
    args = ap.parse_args()
    if args.list:
        for n, _ in cases:
            print(n)
        return 0
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    found = {t: find_tool("dlopt-" + t, args.bin_dir) for t in tools}
    own = args.work_dir is None
    work = tempfile.mkdtemp(prefix=tmp_prefix) if own else args.work_dir
    os.makedirs(work, exist_ok=True)
    if setup:
        setup(work)
    print("%s: %sseed %d (rerun with --seed %d), work dir %s" % (
        prog, "backend %s, " % args.backend if backend else "", args.seed, args.seed, work))
    sys.stdout.flush()
    pat = re.compile(args.filter) if args.filter else None
    names = [n for n, _ in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    passed = failed = 0
    failures = []
    t0 = time.time()
    for name, fn in cases:
        if pat and not pat.search(name):
            continue
        t1 = time.time()
        try:
            ok, det = run_one(name, fn, args, found, work)
        except Exception as e:  # a harness bug must not hide the other cases
            ok, det = False, "harness exception: %r%s" % (
                e, " (%s)" % e.filename if exc_filename and getattr(e, "filename", None) else "")
        if ok:
            passed += 1
        else:
            failed += 1
            failures.append(name)
        print("%s %s: %s%s" % ("PASS" if ok else "FAIL", name, det,
                               "  [%.1f s]" % (time.time() - t1) if timed else ""))
        sys.stdout.flush()
    print("time %.1f s" % (time.time() - t0))
    if failures:
        print("failed %ss: %s" % (item, " ".join(failures)))
        print("(seed %d; %s are in %s)" % (args.seed, kept, work))
    elif own:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0
