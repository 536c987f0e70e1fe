#!/usr/bin/env python3
"""Prices random training plans with the search's closed form and the
discrete-event simulator, and prints how far apart the two are.

Every `dlopt-compile --dry-run` reports both: the step time the search
chose the plan by (the closed form, planner/TransformerPricing.cpp) and the
simulator's replay of the same plan (docs/simulator.md). They should
agree; where they do not, one of them is wrong (docs/simulator.md, "The
simulator against the search's analytical step"). The golden corpus of
the tests covers the plans the search picks on small clusters; this
covers the corners: a random draw of models (GPT-3 1.3B, 6.7B, 13B, Llama
3 8B, 70B), clusters (1-16 DGX A100 or H100 nodes) and fixed plans (tp,
pp, cp, sequence parallelism, micro-batch size and count, every schedule,
ZeRO stage and recomputation policy). Plans that do not fit in memory or
that the planner refuses (interleaved with micro-batches not a multiple
of the stages, say) are counted, not priced.

It is a benchmark: it prints figures and fails only when dlopt-gen or
dlopt-compile fails for another reason than memory or an impossible fix,
or when a --max-median / --max-apart guard is not met (the test suite's
test/e2e/sim-vs-closed-form.test).

Usage: scripts/sim-vs-closed-form.py [--bin build/bin] [--seed N]
           [--plans N] [--worst K] [--json FILE]
           [--max-median FRACTION] [--max-apart FRACTION]
           [--attention-kernel fused|unfused]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {"gpt3-1.3b": 24, "gpt3-6.7b": 32, "gpt3-13b": 40,
          "llama3-8b": 32, "llama3-70b": 80}
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zero-bubble"]
RECOMPUTE = ["none", "selective", "elementwise", "alternate", "full"]


def draw(rng, cp_allowed=True):
    """One plan: (model, cluster, global batch, fix), or None."""
    model = rng.choice(sorted(MODELS))
    layers = MODELS[model]
    cluster = rng.choice(["dgx-a100", "dgx-h100"])
    nodes = rng.choice([1, 2, 4, 8, 16])
    gpus = 8 * nodes
    tp = rng.choice([1, 2, 4, 8])
    pp = rng.choice([1, 2, 4, 8])
    cp = rng.choice([1, 1, 1, 2])
    if not cp_allowed:
        cp = 1
    if tp * pp > gpus:
        return None
    if tp * pp * cp > gpus:
        cp = 1
    dp = gpus // (tp * pp * cp)
    mbs = rng.choice([1, 2, 4])
    mb = rng.choice([1, 2, 4, 8, 16])
    fix = {"dp": dp, "tp": tp, "pp": pp, "mbs": mbs}
    if cp > 1:
        fix["cp"] = cp
    if pp > 1:
        schedule = rng.choice(SCHEDULES)
        fix["schedule"] = schedule
        if schedule == "interleaved":
            v = rng.choice([2, 4])
            if layers % (pp * v):
                return None
            fix["v"] = v
            if mb % pp:
                mb = pp * rng.choice([1, 2])
    fix["mb"] = mb
    fix["zero"] = rng.choice([0, 1, 2, 3])
    if dp * cp == 1:
        # Nothing to shard over: the planner refuses zero > 0 there.
        fix["zero"] = 0
    fix["recompute"] = rng.choice(RECOMPUTE)
    if tp > 1 and rng.random() < 0.5:
        fix["sp"] = 1
    spec = ",".join("%s=%s" % kv for kv in fix.items())
    return model, "%s:%d" % (cluster, nodes), dp * mbs * mb, spec


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plans", type=int, default=400,
                    help="plans to draw (some are skipped as impossible)")
    ap.add_argument("--worst", type=int, default=10,
                    help="list this many of the largest differences")
    ap.add_argument("--json", help="also write every plan's result here")
    ap.add_argument("--max-median", type=float,
                    help="exit 1 unless the median |d| is at most this")
    ap.add_argument("--max-apart", type=float,
                    help="exit 1 if any plan's |d| is more than this")
    ap.add_argument("--attention-kernel", choices=["fused", "unfused"],
                    default="fused",
                    help="price attention as dlopt's fused kernels or as "
                    "unfused ones (dlopt-compile --attention-kernel; no cp "
                    "is drawn with unfused)")
    args = ap.parse_args()
    for name, v in (("--max-median", args.max_median),
                    ("--max-apart", args.max_apart)):
        if v is not None and not (v >= 0):
            ap.error("%s: expected a fraction >= 0, got %s" % (name, v))
    rng = random.Random(args.seed)
    results, unfit, refused = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(MODELS):
            p = subprocess.run(
                [os.path.join(args.bin, "dlopt-gen"), name, "--dtype", "bf16",
                 "-q", "-o", os.path.join(tmp, name + ".mlir")],
                stderr=subprocess.PIPE, universal_newlines=True)
            if p.returncode != 0:
                sys.exit("sim-vs-closed-form: dlopt-gen %s: %s" %
                         (name, p.stderr.strip()))
        for _ in range(args.plans):
            plan = draw(rng, args.attention_kernel == "fused")
            if plan is None:
                continue
            model, cluster, gb, fix = plan
            p = subprocess.run(
                [os.path.join(args.bin, "dlopt-compile"),
                 os.path.join(tmp, model + ".mlir"), "--dry-run", "--train",
                 "--format", "json", "--precision", "bf16", "--cluster",
                 cluster, "--global-batch", str(gb), "--fix", fix,
                 "--attention-kernel", args.attention_kernel],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                universal_newlines=True)
            if p.returncode != 0:
                err = (p.stderr.strip().splitlines() or ["exit"])[-1]
                if "no plan fits in memory" in err:
                    unfit += 1
                    continue
                if "is impossible" in err:
                    refused += 1
                    continue
                sys.exit("sim-vs-closed-form: %s %s --fix %s: %s" %
                         (model, cluster, fix, err))
            rep = json.loads(p.stdout)["report"]
            closed = rep["step_time"]["total"]
            sim = rep.get("simulation", {}).get("step_time")
            if not sim:
                sys.exit("sim-vs-closed-form: %s %s --fix %s: no simulation" %
                         (model, cluster, fix))
            results.append({"model": model, "cluster": cluster,
                            "global_batch": gb, "fix": fix,
                            "closed_form": closed, "simulated": sim,
                            "d": closed / sim - 1})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("Closed form against the simulator's replay (d = closed form / "
          "replay - 1; negative: the closed form is faster)")
    print("seed %d: %d plans priced, %d do not fit, %d refused" %
          (args.seed, len(results), unfit, refused))
    if not results:
        return
    absd = sorted(abs(r["d"]) for r in results)
    print("median |d| %.2f%%, more than 2%%: %d, 5%%: %d, 10%%: %d, "
          "largest %.1f%%" % (
              100 * statistics.median(absd),
              sum(1 for a in absd if a > 0.02),
              sum(1 for a in absd if a > 0.05),
              sum(1 for a in absd if a > 0.10), 100 * absd[-1]))
    print("above the replay: %d, below: %d (of those more than 2%% apart)" % (
        sum(1 for r in results if r["d"] > 0.02),
        sum(1 for r in results if r["d"] < -0.02)))
    for r in sorted(results, key=lambda r: -abs(r["d"]))[:args.worst]:
        print("  %+6.1f%%  %-10s %-12s --fix %s" % (
            100 * r["d"], r["model"], r["cluster"], r["fix"]))
    failed = []
    if args.max_median is not None and \
            statistics.median(absd) > args.max_median:
        failed.append("median |d| %.2f%% over %.2f%%" % (
            100 * statistics.median(absd), 100 * args.max_median))
    if args.max_apart is not None and absd[-1] > args.max_apart:
        failed.append("a plan %.1f%% apart, over %.1f%%" % (
            100 * absd[-1], 100 * args.max_apart))
    if failed:
        sys.exit("sim-vs-closed-form: FAIL: " + "; ".join(failed))


if __name__ == "__main__":
    main()
