#!/usr/bin/env python3
"""Elementwise fusion (dlopt-fuse-elementwise) changes the plan, not the math.

Each case compiles one training step three times, with fusion and the
multi-tensor merge (the default), with `--merge-fused-elementwise=false`
(one instruction per fused group) and with `dlopt-compile
--fuse-elementwise=false`, runs each for N steps from the
same seed on the CPU backend, and compares the per-step losses/lr/grad_norm
(metrics JSONL) and every tensor of the final checkpoints (params and
optimizer state). The merged and unmerged plans must agree bitwise in every
case. It also checks that fusion and the merge each reduce the instruction
count and prints the counts and the wall time of the N steps.

  gpt_tiny.adamw.f32  dlopt-gen gpt --preset gpt-tiny, AdamW with warmup +
                      cosine and clipping. f32 throughout: the fused kernel
                      evaluates each op with the same f32 function as the
                      unfused kernel, so results must be bitwise identical.
  mlp.adam.f32        dlopt-gen mlp with Adam: bitwise identical.
  mlp.adamw.bf16      the MLP with --precision bf16 (fp32 master weights):
                      the forward chains fused in bf16 keep intermediates in
                      f32 instead of rounding them to bf16, so losses and
                      params differ by those roundings only: relative loss
                      difference < 2e-2 per step, and every param within
                      2e-3 + 1e-2 |p| of the unfused run (Adam steps are
                      ~lr = 1e-3 each).
  gpt_tiny.no_grad_norm  gpt-tiny with AdamW compiled with and without
                      --grad-norm=false (no global norm, no grad_norm
                      result): bitwise identical losses, lr and checkpoints,
                      fewer instructions, no grad_norm in the metrics.

  check_fusion.py [--work-dir DIR] [--seed N] [--filter REGEX] [--list]

Prints one line per case, then `N passed, M failed`; exits 1 on any failure.
"""
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Ctx, Failure  # noqa: E402
from dlopt_train_np import read_jsonl, read_safetensors  # noqa: E402


PLANS = {"fused": [], "nomerge": ["--merge-fused-elementwise=false"], "unfused": ["--fuse-elementwise=false"]}


def compile_both(ctx, model, flags):
    """Compiles with fusion and the multi-tensor merge (the default), with
    fusion but no merge, and without fusion; returns the instruction counts
    (keyed True = fused+merged, False = unfused, "nomerge") and the number of
    fused instructions of the default plan."""
    counts = {}
    for tag, extra in PLANS.items():
        args = ["--train"] + flags + [model, "-o", ctx.path(tag + ".plan")] + extra
        r = ctx.tool("compile", args)
        m = re.search(r"(\d+) instructions", r.stdout + r.stderr)
        if not m:
            raise Failure("no instruction count in dlopt-compile's summary: %r" % (r.stdout + r.stderr)[-300:])
        counts[{"fused": True, "unfused": False}.get(tag, tag)] = int(m.group(1))
    dump = ctx.tool("run", [ctx.path("fused.plan"), "--dump"]).stdout
    groups = dump.count("= fused_elementwise(")
    if groups == 0 or counts[True] >= counts[False]:
        raise Failure("fusion did not reduce the plan: %d fused groups, %d vs %d instructions" % (
            groups, counts[True], counts[False]))
    if "= fused_elementwise(" in ctx.tool("run", [ctx.path("unfused.plan"), "--dump"]).stdout:
        raise Failure("--fuse-elementwise=false still fused")
    nomerge = ctx.tool("run", [ctx.path("nomerge.plan"), "--dump"]).stdout
    if "segments" in nomerge:
        raise Failure("--merge-fused-elementwise=false still merged")
    if "segments=" not in dump or counts[True] >= counts["nomerge"]:
        raise Failure("the multi-tensor merge did not reduce the plan: %d vs %d instructions" % (
            counts[True], counts["nomerge"]))
    return counts, groups


def run_both(ctx, steps, data_args):
    out = {}
    for tag in PLANS:
        t0 = time.time()
        ctx.tool("run", [ctx.path(tag + ".plan"), "--steps", str(steps), "--checkpoint-dir", ctx.path(tag),
                         "--metrics", ctx.path(tag + ".jsonl"), "--seed", str(ctx.seed % 100000),
                         "--threads", "1", "--quiet"] + data_args, timeout=600)
        dt = time.time() - t0
        tensors, _ = read_safetensors(ctx.path(tag, "step-%06d.safetensors" % steps))
        out[tag] = (read_jsonl(ctx.path(tag + ".jsonl")), tensors, dt)
    return out


def compare(out, steps, exact, loss_rtol=0.0, atol=0.0, rtol=0.0, a="fused", b="unfused"):
    mf, tf, _ = out[a]
    mu, tu, _ = out[b]
    if len(mf) != steps or len(mu) != steps:
        raise Failure("metrics: %d and %d steps, expected %d" % (len(mf), len(mu), steps))
    worst_loss = 0.0
    for a, b in zip(mf, mu):
        for k in ("loss", "lr", "grad_norm"):
            if exact and a[k] != b[k]:
                raise Failure("step %d %s: %r fused, %r unfused" % (a["step"], k, a[k], b[k]))
        rel = abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-6)
        worst_loss = max(worst_loss, rel)
        if rel > loss_rtol and not exact:
            raise Failure("step %d loss %r fused, %r unfused (relative %.2g > %.2g)" % (
                a["step"], a["loss"], b["loss"], rel, loss_rtol))
    if sorted(tf) != sorted(tu):
        raise Failure("checkpoint tensors differ: %s vs %s" % (sorted(tf), sorted(tu)))
    worst = 0.0
    for k in tu:
        a, b = tf[k], tu[k]
        if exact:
            if a.tobytes() != b.tobytes():
                d = np.abs(a.astype(np.float64) - b.astype(np.float64))
                raise Failure("%s differs after %d steps (max |diff| %.3g)" % (k, steps, d.max()))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        d = np.abs(a64 - b64)
        bound = atol + rtol * np.abs(b64)
        if (d > bound).any():
            i = int(np.argmax(d - bound))
            raise Failure("%s element %d: %r fused, %r unfused (bound %.3g)" % (
                k, i, a64.flat[i], b64.flat[i], bound.flat[i]))
        worst = max(worst, float(d.max()))
    return worst_loss, worst, len(tu)


def merge_is_exact(out, steps):
    """The multi-tensor merge changes the plan only: bitwise the same as one
    fused instruction per group, in every precision."""
    compare(out, steps, exact=True, a="fused", b="nomerge")


def summary(counts, groups, out, steps):
    cf, cu, cn = counts[True], counts[False], counts["nomerge"]
    return ("%d -> %d instructions fused -> %d merged (-%.0f%%, %d fused instructions); "
            "%d CPU steps %.2f s fused+merged, %.2f s fused, %.2f s unfused") % (
        cu, cn, cf, 100.0 * (cu - cf) / cu, groups, steps, out["fused"][2], out["nomerge"][2],
        out["unfused"][2])


def gpt_tiny_adamw(ctx):
    steps = 4
    toks = ctx.rng.integers(0, 128, size=4000).astype(np.int32)
    np.save(ctx.path("train.npy"), toks)
    ctx.tool("gen", ["gpt", "--preset", "gpt-tiny", "-q", "-o", ctx.path("gpt.mlir")])
    counts, groups = compile_both(ctx, ctx.path("gpt.mlir"), [
        "--optimizer", "adamw", "--lr", "3e-3", "--schedule", "cosine", "--warmup-steps", "1",
        "--total-steps", "10", "--clip-norm", "1.0"])
    out = run_both(ctx, steps, ["--data", ctx.path("train.npy")])
    _, _, n = compare(out, steps, exact=True)
    merge_is_exact(out, steps)
    return "bitwise identical losses and %d checkpoint tensors; %s" % (n, summary(counts, groups, out, steps))


def mlp_model(ctx):
    ctx.tool("gen", ["mlp", "-q", "-o", ctx.path("mlp.mlir")])
    return ctx.path("mlp.mlir")


def mlp_case(ctx, flags, exact):
    steps = 5
    model = mlp_model(ctx)
    counts, groups = compile_both(ctx, model, flags)
    out = run_both(ctx, steps, [])
    worst_loss, worst, n = compare(out, steps, exact, loss_rtol=2e-2, atol=2e-3, rtol=1e-2)
    merge_is_exact(out, steps)
    if exact:
        return "bitwise identical losses and %d checkpoint tensors; %s" % (n, summary(counts, groups, out, steps))
    return "%d checkpoint tensors within bounds (max |diff| %.2g, max relative loss diff %.2g); %s" % (
        n, worst, worst_loss, summary(counts, groups, out, steps))


def mlp_adam(ctx):
    return mlp_case(ctx, ["--optimizer", "adam", "--lr", "1e-3"], exact=True)


def mlp_adamw_bf16(ctx):
    return mlp_case(ctx, ["--optimizer", "adamw", "--lr", "1e-3", "--precision", "bf16"], exact=False)


def gpt_tiny_no_grad_norm(ctx):
    """--grad-norm=false drops the global norm's pass over the gradients
    and the grad_norm result: the training is bitwise the same, the plan
    shorter, and the metrics have no grad_norm."""
    steps = 3
    toks = ctx.rng.integers(0, 128, size=4000).astype(np.int32)
    np.save(ctx.path("train.npy"), toks)
    ctx.tool("gen", ["gpt", "--preset", "gpt-tiny", "-q", "-o", ctx.path("gpt.mlir")])
    counts, out = {}, {}
    for tag, extra in (("norm", []), ("nonorm", ["--grad-norm=false"])):
        r = ctx.tool("compile", ["--train", "--optimizer", "adamw", ctx.path("gpt.mlir"),
                                 "-o", ctx.path(tag + ".plan")] + extra)
        counts[tag] = int(re.search(r"(\d+) instructions", r.stdout + r.stderr).group(1))
        ctx.tool("run", [ctx.path(tag + ".plan"), "--steps", str(steps), "--checkpoint-dir", ctx.path(tag),
                         "--metrics", ctx.path(tag + ".jsonl"), "--seed", str(ctx.seed % 100000),
                         "--threads", "1", "--quiet", "--data", ctx.path("train.npy")])
        tensors, _ = read_safetensors(ctx.path(tag, "step-%06d.safetensors" % steps))
        out[tag] = (read_jsonl(ctx.path(tag + ".jsonl")), tensors)
    def has_norm_output(tag):  # the dump's output lines: "  grad_norm = %N : f32"
        dump = ctx.tool("run", [ctx.path(tag + ".plan"), "--dump"]).stdout
        return re.search(r"^\s+grad_norm = %", dump, re.M) is not None
    if not has_norm_output("norm") or has_norm_output("nonorm"):
        raise Failure("grad_norm outputs: %s with the norm, %s without" % (
            has_norm_output("norm"), has_norm_output("nonorm")))
    if counts["nonorm"] >= counts["norm"]:
        raise Failure("--grad-norm=false did not shorten the plan: %d vs %d instructions" % (
            counts["nonorm"], counts["norm"]))
    (mn, tn), (mo, to) = out["norm"], out["nonorm"]
    for a, b in zip(mn, mo):
        if "grad_norm" not in a or "grad_norm" in b:
            raise Failure("step %d: grad_norm in the metrics %s / %s" % (a["step"], a.keys(), b.keys()))
        if a["loss"] != b["loss"] or a["lr"] != b["lr"]:
            raise Failure("step %d: loss/lr %r/%r with the norm, %r/%r without" % (
                a["step"], a["loss"], a["lr"], b["loss"], b["lr"]))
    if sorted(tn) != sorted(to):
        raise Failure("checkpoint tensors differ: %s vs %s" % (sorted(tn), sorted(to)))
    for k in tn:
        if tn[k].tobytes() != to[k].tobytes():
            raise Failure("%s differs after %d steps" % (k, steps))
    return "bitwise identical losses and %d checkpoint tensors; %d -> %d instructions" % (
        len(tn), counts["norm"], counts["nonorm"])


CASES = [("gpt_tiny.adamw.f32", gpt_tiny_adamw), ("mlp.adam.f32", mlp_adam), ("mlp.adamw.bf16", mlp_adamw_bf16),
         ("gpt_tiny.no_grad_norm", gpt_tiny_no_grad_norm)]


def run_case(name, fn, args, tools, work):
    return harness.run_ctx_case(Ctx(name, args.seed, tools, work), fn)


def main():
    return harness.main("check_fusion", __doc__, CASES, run_case, "dlopt-check-fusion-",
                        "models, plans, metrics and checkpoints", tools=("gen", "compile", "run"))


if __name__ == "__main__":
    sys.exit(main())
