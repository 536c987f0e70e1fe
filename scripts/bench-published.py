#!/usr/bin/env python3
"""Prices published training runs with dlopt's planner and prints the
predicted step time against the published one.

Each run of bench/published/ (runs.json and the MPT tables of
llm-foundry.md) names a model, a cluster, a global batch and the plan the
authors ran. This script writes the model with dlopt-gen, prices the plan
with `dlopt-compile --dry-run --fix ...`, turns the published figure into
seconds per step (the rule of its group), and prints both, with the
difference (predicted / published - 1: negative = dlopt is optimistic).

It is a benchmark: it prints figures, and fails only when a row cannot
be priced at all (dlopt-gen or dlopt-compile refused it for another
reason than memory), when a generated model's parameter count differs
from the published one, or when a --require guard is not met (the test
suite's test/e2e/published-runs.test). A run that fits on its cluster but
not in dlopt's memory model is listed and counted, not priced.

Usage: scripts/bench-published.py [--bin build/bin] [--only REGEX]
           [--jobs N] [--json FILE] [--require GROUP=FRACTION ...]
"""

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "bench", "published")

# MPT model dims (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml):
# layers, hidden, heads.
MPT = {
    "125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12),
    "1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32),
    "13b": (40, 5120, 40), "30b": (48, 7168, 56), "70b": (80, 8192, 64),
}
GPU_CLUSTER = {"a100_80gb": "dgx-a100", "h100_80gb": "dgx-h100",
               "a100_40gb": "dgx-a100-40gb"}

# Clusters that are not presets, by name, as cluster files with N nodes:
# the A100 40GB (40 GiB of HBM2 at 1555 GB/s) in DGX A100 nodes with the
# same 1600 Gb/s of network per node as llm-foundry's 80GB nodes.
CLUSTER_FILES = {
    "dgx-a100-40gb": """name: dgx-a100-40gb
nodes: %d
gpus_per_node: 8
gpu: {base: a100-sxm-80gb, name: A100-SXM-40GB, memory_gib: 40, memory_bandwidth_gb_s: 1555}
intra_node: {topology: nvswitch, bidirectional_bandwidth_gb_s: 600, latency_us: 1}
network: {nics: 8, nic_gbit_s: 200, latency_us: 5}
host: {cpu_cores: 128, memory_gb: 1024}
""",
}


def mpt_rows():
    """Rows of the MPT tables in llm-foundry.md (one group per table)."""
    groups = []
    header = None
    group = None
    with open(os.path.join(DATA, "llm-foundry.md")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("## "):
                group = {"name": "llm-foundry " + line[3:].split(" with")[0],
                         "source": "mosaicml/llm-foundry scripts/train/"
                                   "benchmarking/README.md (" + line[3:] + ")",
                         "measured_rule": "tokens_per_s", "rows": []}
                groups.append(group)
                header = None
                continue
            if not line.startswith("|") or group is None:
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
                continue
            if cells[0].startswith("---"):
                continue
            if len(cells) == len(header) + 1 and "Model TFLOP" not in header:
                # The published A100 40GB table's header lacks the Model
                # TFLOP column that its rows have, after HFU.
                header.insert(header.index("HFU") + 1, "Model TFLOP")
            if len(cells) != len(header):
                sys.exit("llm-foundry.md: %d cells, %d columns: %s"
                         % (len(cells), len(header), line))
            r = dict(zip(header, cells))
            layers, hidden, heads = MPT[r["Model"]]
            gpus = int(r["# GPUs"])
            mbs, accum = int(r["MicroBatchSize"]), int(r["GradAccum"])
            batch = int(r["GlobalBatchSize"])
            if mbs * accum * gpus != batch:
                sys.exit("llm-foundry.md: %s: %d x %d x %d != %d"
                         % (line, mbs, accum, gpus, batch))
            cluster = GPU_CLUSTER[r["GPU"]]
            recompute = "full" if r["Activation Checkpointing"] == "True" \
                else "none"
            # FULL_SHARD gathers each layer's parameters for its forward
            # and again for its backward (ZeRO-3); SHARD_GRAD_OP keeps them
            # gathered from the forward to the end of the backward pass and
            # shards the gradients and optimizer state (ZeRO-2).
            zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}.get(
                r["Sharding Strategy"])
            if zero is None:
                sys.exit("llm-foundry.md: unknown sharding strategy %r: %s"
                         % (r["Sharding Strategy"], line))
            precision = {"amp_bf16": "bf16", "bf16": "bf16",
                         "amp_fp8": "fp8"}.get(r["Precision"])
            if precision is None:
                sys.exit("llm-foundry.md: unknown precision %r: %s"
                         % (r["Precision"], line))
            group["rows"].append({
                "name": "%s s%s %sx%s mbs%d%s%s" % (
                    r["Model"], r["SeqLen (T)"], gpus, r["GPU"].split("_")[0],
                    mbs, " ckpt" if recompute == "full" else "",
                    " fp8" if precision == "fp8" else ""),
                "gen": ["gpt", "--layers", str(layers), "--hidden",
                        str(hidden), "--heads", str(heads), "--seq",
                        r["SeqLen (T)"], "--vocab", "50368"],
                "params": int(r["NumParams"]),
                "cluster": "%s:%d" % (cluster, max(1, gpus // 8)),
                "global_batch": batch,
                "precision": precision,
                "fix": "dp=%d,tp=1,pp=1,mbs=%d,zero=%d,recompute=%s"
                       % (gpus, mbs, zero, recompute),
                "tokens_per_s": float(r["Throughput (T/s)"]),
                "global_tokens": float(r["GlobalBatchSize (T)"]),
            })
    return groups


def measured_step(rule, row, devices):
    """The published figure as seconds per step."""
    if rule == "step_seconds":
        return row["step_s"]
    if rule == "tokens_per_s":
        return row["global_tokens"] / row["tokens_per_s"]
    if rule == "tokens_per_s_per_gpu":
        tokens = row["global_batch"] * row["seq"]
        return tokens / (row["tokens_per_s_per_gpu"] * devices)
    if rule == "narayanan_tflops":
        # Narayanan et al. 2021, eq. 3 (counts the recomputed forward).
        m = row["model"]
        b, s, l, h, v = (row["global_batch"], m["seq"], m["layers"],
                         m["hidden"], m["vocab"])
        flops = 96.0 * b * s * l * h * h * (1 + s / (6.0 * h) +
                                            v / (16.0 * l * h))
        return flops / (row["tflops_per_gpu"] * 1e12 * devices)
    raise ValueError("unknown rule " + rule)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    return p.returncode, p.stdout, p.stderr


def model_path(tmp, row):
    key = re.sub(r"[^A-Za-z0-9]+", "_", " ".join(row["gen"]))
    return os.path.join(tmp, key + ".mlir")


def generate(args, tmp, row):
    """Writes the row's model once (rows that share a model share the file;
    every model is written before any is priced)."""
    model = model_path(tmp, row)
    if os.path.exists(model):
        return None
    rc, out, err = run([os.path.join(args.bin, "dlopt-gen")] + row["gen"] +
                       ["-o", model])
    return None if rc == 0 else "dlopt-gen: " + err.strip()


def cluster_arg(tmp, spec):
    """A preset spec as is; NAME:N of CLUSTER_FILES as a file of N nodes."""
    name, _, nodes = spec.partition(":")
    if name not in CLUSTER_FILES:
        return spec
    path = os.path.join(tmp, "%s-%s.yaml" % (name, nodes or "1"))
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(CLUSTER_FILES[name] % int(nodes or 1))
    return path


def price(args, tmp, group, row):
    model = model_path(tmp, row)
    reduce = row.get("grad_reduce", group.get("grad_reduce"))
    attention = row.get("attention_kernel", group.get("attention_kernel"))
    eager = row.get("eager_kernels", group.get("eager_kernels"))
    rc, out, err = run([os.path.join(args.bin, "dlopt-compile"), model,
                        "--dry-run", "--train", "--format", "json",
                        "--precision", row.get("precision",
                                               group.get("precision", "bf16")),
                        "--cluster", cluster_arg(tmp, row["cluster"]),
                        "--global-batch", str(row["global_batch"]),
                        "--fix", row["fix"]] +
                       (["--grad-reduce", reduce] if reduce else []) +
                       (["--attention-kernel", attention] if attention else []) +
                       (["--eager-kernels", eager] if eager else []) +
                       [a for c in args.calibration for a in ("--calibration", c)])
    if rc != 0:
        last = (err.strip().splitlines() or ["exit %d" % rc])[-1]
        if "no plan fits in memory" in last:
            m = re.search(r"smallest peak found is ([0-9.]+ GiB)", last)
            return {"unfit": m.group(1) if m else last}
        return {"error": last}
    d = json.loads(out)
    rep = d["report"]
    dims = d["model"]
    return {"params": int(dims["params"]), "devices": d["cluster"]["devices"],
            "step": rep["step_time"]["total"],
            "sim": rep.get("simulation", {}).get("step_time"),
            "memory": rep["memory"]["total"],
            "capacity": rep["memory"]["capacity"],
            "mfu": rep["throughput"]["mfu"],
            "model": {"seq": dims.get("seq"), "layers": dims.get("layers"),
                      "hidden": dims.get("hidden"),
                      "vocab": dims.get("vocab")}}


def summarize(label, errs):
    """Prints one summary line; returns the median |d| (None: no runs)."""
    if not errs:
        return None
    absd = sorted(abs(e) for e in errs)
    print("  %-28s %3d runs  median %+6.1f%%  median |d| %5.1f%%  "
          "worst %+6.1f%%  within 10%%: %d  within 20%%: %d" % (
              label, len(errs), 100 * statistics.median(errs),
              100 * statistics.median(absd),
              100 * max(errs, key=abs),
              sum(1 for e in absd if e <= 0.10),
              sum(1 for e in absd if e <= 0.20)))
    return statistics.median(absd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--only", help="price only rows whose group or name "
                                   "matches this regular expression")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--calibration", action="append", default=[],
                    help="price with this calibration file too (repeatable, "
                         "as dlopt-compile's; e.g. a collective_table of "
                         "dlopt-calibrate --nccl-tests)")
    ap.add_argument("--json", help="also write the rows and results here")
    ap.add_argument("--require", action="append", default=[],
                    metavar="GROUP=FRACTION",
                    help="exit 1 unless GROUP's (or 'all') median |d| is at "
                         "most FRACTION (a guard for the test suite)")
    args = ap.parse_args()
    required = {}
    for spec in args.require:
        name, _, frac = spec.rpartition("=")
        try:
            required[name] = float(frac)
        except ValueError:
            ap.error("--require %s: expected GROUP=FRACTION" % spec)

    with open(os.path.join(DATA, "runs.json")) as f:
        groups = json.load(f)["groups"]
    groups += mpt_rows()

    work = []
    for g in groups:
        for r in g["rows"]:
            if args.only and not re.search(args.only, g["name"] + " " +
                                           r["name"]):
                continue
            work.append((g, r))
    if not work:
        sys.exit("bench-published: no row matches --only %s" % args.only)

    failed = 0
    unfit = 0
    results = []
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        gen_errors = {}
        for g, r in work:
            cluster_arg(tmp, r["cluster"])  # written before the threads
            e = generate(args, tmp, r)
            if e:
                gen_errors[model_path(tmp, r)] = e
        futures = [None if model_path(tmp, r) in gen_errors else
                   pool.submit(price, args, tmp, g, r) for g, r in work]
        for (g, r), fut in zip(work, futures):
            res = fut.result() if fut else \
                {"error": gen_errors[model_path(tmp, r)]}
            results.append((g, r, res))

    print("Published training runs priced by dlopt-compile --dry-run --fix "
          "(d = predicted / published - 1; negative: dlopt is optimistic)")
    by_group = {}
    for g, r, res in results:
        if g["name"] not in by_group:
            by_group[g["name"]] = []
            print("\n== %s ==\n   %s" % (g["name"], g["source"][:160] +
                                         ("..." if len(g["source"]) > 160
                                          else "")))
            print("   %-26s %10s %10s %8s %8s %9s %6s" % (
                "run", "published", "dlopt", "d", "d(sim)", "memory", "MFU"))
        if "error" in res:
            failed += 1
            print("   %-26s %s" % (r["name"], res["error"]))
            continue
        if "unfit" in res:
            unfit += 1
            print("   %-26s does not fit in dlopt's memory model: %s "
                  "per device at the least" % (r["name"], res["unfit"]))
            continue
        if r.get("params") and res["params"] != r["params"]:
            failed += 1
            print("   %-26s model has %s parameters, published %d"
                  % (r["name"], res["params"], r["params"]))
            continue
        r = dict(r)
        r["seq"] = res["model"]["seq"]
        r["model"] = res["model"]
        meas = measured_step(g["measured_rule"], r, res["devices"])
        d = res["step"] / meas - 1
        dsim = res["sim"] / meas - 1 if res["sim"] else float("nan")
        by_group[g["name"]].append(d)
        over = " >cap" if res["memory"] > res["capacity"] else ""
        print("   %-26s %9.3fs %9.3fs %+7.1f%% %+7.1f%% %6.1f GiB %5.1f%%%s" % (
            r["name"], meas, res["step"], 100 * d, 100 * dsim,
            res["memory"] / 2**30, 100 * res["mfu"], over))
        res["published_step"] = meas
        res["d"] = d

    print("\nSummary (step time):")
    every = []
    medians = {}
    for name, errs in by_group.items():
        medians[name] = summarize(name, errs)
        every += errs
    medians["all"] = summarize("all", every)
    for name, limit in required.items():
        got = medians.get(name)
        if got is None:
            print("\n--require %s: no priced run in that group" % name)
            failed += 1
        elif got > limit:
            print("\n--require %s: median |d| %.1f%% is over %.1f%%"
                  % (name, 100 * got, 100 * limit))
            failed += 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"group": g["name"], "row": r, "result": res}
                       for g, r, res in results], f, indent=1)
    if unfit:
        print("\n%d run(s) that fit on the published cluster do not fit in "
              "dlopt's memory model" % unfit)
    if failed:
        print("\nFAIL: %d run(s) could not be priced or a --require failed"
              % failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
