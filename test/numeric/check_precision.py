#!/usr/bin/env python3
"""Mixed precision (--precision bf16|fp16) and activation recomputation
(--recompute none|selective|elementwise|alternate|full) of `dlopt-compile --train`,
end to end.

  ir.bf16.gpt        --emit=mlir of a 2-layer GPT at --precision bf16: every
                     matmul (forward and backward) is bf16; params, optimizer
                     state (dlopt.state args), their update outputs and the
                     loss are f32; the loss comes from an f32 cross_entropy.
  ir.bf16.fp32_ops   a hand-written model using softmax, log_softmax, sum,
                     mean, cross_entropy and mse: in the forward pass these
                     operate on f32 while its matmuls are bf16.
  ir.fp16.gpt        the same at --precision fp16 (matmuls f16), plus the
                     dynamic loss-scaling state: `loss_scale` (f32 scalar,
                     init constant 65536) and `loss_scale.good_steps` (i64).
  bf16.tracks_f32    the GPT trained 100 AdamW steps at f32 and at bf16 (same
                     seed, same Markov-chain corpus as check_training.py):
                     |loss_bf16 - loss_f32| <= 5% of loss_f32 at every step,
                     final losses within 3%, and the runs are not bitwise
                     equal (the flag changed the numerics).
  fp16.tracks_f32    the same at fp16: every step within 5%, final within 5%,
                     not bitwise equal; the `loss_scale` state read from a
                     1-step checkpoint is 65536 (good_steps 1, step 1).
  fp16.overflow.skip an MLP whose fp16 gradients overflow at scale 65536
                     (inputs ~10, forward loss finite; a float64 gradient
                     shows max|g| x 65536 > 65504): per-step checkpoints show
                     each overflowing step leaves params and optimizer state
                     bit-identical, keeps the `step` state, halves
                     `loss_scale` and zeroes good_steps; training goes on
                     (exit 0) and a later step updates the params.
  fp16.overflow.reported
                     dlopt-run reports those skipped steps: `"skipped": true`
                     and `loss_scale` in the --metrics line
                     (training-runtime.md), and a "skipped" note in the
                     progress line.
  recompute.memory   a 6-layer GPT (seq 128, dropout 0.1): planned scratch and
                     total memory (dlopt-compile summary, dlopt-run --dump) for
                     none / selective / elementwise / alternate / full;
                     full < alternate < elementwise < none, selective <=
                     none.
  recompute.bitwise  the 2-layer GPT with dropout 0.1, 20 AdamW steps at none,
                     selective, elementwise, alternate and full:
                     bitwise-identical per-step
                     loss/grad_norm and final checkpoints.
  recompute.bitwise_bf16
                     the same at --precision bf16 (none vs full).
  recompute.softmax  a hand-written 2-layer model with unfused attention
                     (softmax feeding a matmul): selective clones the
                     softmaxes, full clones more and plans less scratch, and
                     10 steps are bitwise identical under all three policies.

  check_precision.py [--work-dir DIR] [--seed N] [--filter REGEX] [--list]

Prints one line per check, then `N passed, M failed`; exits 1 on any failure.
"""
import math
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_training import markov_corpus  # noqa: E402
import harness  # noqa: E402
from harness import Failure  # noqa: E402
from dlopt_train_np import read_jsonl, read_safetensors  # noqa: E402

# The GPT of check_training.py's gpt.markov, and its optimizer.
GPT = ["gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "64", "--batch", "8"]
GPT_DEEP = ["gpt", "--layers", "6", "--hidden", "64", "--heads", "4", "--seq", "128", "--vocab", "64",
            "--batch", "8", "--dropout", "0.1"]
TRAIN = ["--train", "--optimizer", "adamw", "--lr", "3e-3", "--clip-norm", "1.0"]
STEPS = 100             # precision comparison
RC_STEPS = 20           # recompute comparison
STEP_TOL = 0.05         # |loss_lp - loss_f32| <= STEP_TOL * loss_f32 at every step
FINAL_TOL = {"bf16": 0.03, "fp16": 0.05}   # final-step bound
FP16_MAX = 65504.0
INIT_SCALE = 65536.0


class Ctx(harness.Ctx):
    def __init__(self, name, seed, tools, work, shared):
        super().__init__(name, seed, tools, work)
        self.shared = shared


# ---------------------------------------------------------------- IR parsing

def elem(ttype):
    """'8x16xf32' / 'f32' -> 'f32'."""
    return ttype.split("x")[-1]


def parse_signature(text):
    """Args [(ssa, type, attrs)] and results [(type, output, update)] of the entry function."""
    m = re.search(r"func\.func @\w+\((.*?)\)\s*->\s*\((.*?)\)\s*attributes", text, re.S)
    if not m:
        raise Failure("cannot find the function signature in the emitted MLIR")
    argtext, restext = m.group(1), m.group(2)
    args = []
    hits = list(re.finditer(r"(%\w+): tensor<([^>]*)>", argtext))
    for i, h in enumerate(hits):
        end = hits[i + 1].start() if i + 1 < len(hits) else len(argtext)
        args.append((h.group(1), h.group(2), argtext[h.end():end]))
    results = []
    for h in re.finditer(r'tensor<([^>]*)>\s*\{([^}]*)\}', restext):
        out = re.search(r'dlopt\.output = "([^"]*)"', h.group(2))
        upd = re.search(r'dlopt\.update = "([^"]*)"', h.group(2))
        results.append((h.group(1), out.group(1) if out else None, upd.group(1) if upd else None))
    return args, results


def attr_str(attrs, key):
    m = re.search(r'%s = "([^"]*)"' % re.escape(key), attrs)
    return m.group(1) if m else None


def parse_ops(text):
    """[(result ssa or None, op name, operand types, result types, is_forward, line)]."""
    ops = []
    for line in text.splitlines():
        m = re.match(r"\s*(?:(%[\w#:, %]+?)\s*=\s*)?dlopt\.(\w+)\s", line)
        if not m:
            continue
        types = re.findall(r"tensor<([^>]*)>", line)
        if "->" in line:
            pre, post = line.rsplit("->", 1)
            ins, outs = re.findall(r"tensor<([^>]*)>", pre), re.findall(r"tensor<([^>]*)>", post)
        else:
            ins = outs = types
        fwd = "dlopt.backward" not in line and "dlopt.recompute" not in line
        ops.append((m.group(1), m.group(2), ins, outs, fwd, line.strip()))
    return ops


def is_float(e):
    return e in ("f32", "f16", "bf16", "f64")


def check_mixed_ir(text, low, need_ops, loss_must_be_f32=True):
    """Common rules of a --precision low step. Returns a detail string."""
    args, results = parse_signature(text)
    ops = parse_ops(text)
    params = [(n, t, attr_str(a, "dlopt.param")) for n, t, a in args if "dlopt.param" in a]
    states = [(n, t, attr_str(a, "dlopt.state"), a) for n, t, a in args if "dlopt.state" in a]
    if not params:
        raise Failure("no dlopt.param arguments")
    bad = ["%s (%s)" % (p, t) for _, t, p in params if elem(t) != "f32"]
    if bad:
        raise Failure("params are not f32 master weights: %s" % ", ".join(bad[:5]))
    bad = ["%s (%s)" % (s, t) for _, t, s, _ in states if is_float(elem(t)) and elem(t) != "f32"]
    if bad:
        raise Failure("float optimizer state is not f32: %s" % ", ".join(bad[:5]))
    moments = [s for _, _, s, _ in states if s.startswith("adamw.")]
    if len(moments) != 2 * len(params):
        raise Failure("expected adamw.m/v state for each of %d params, found %d" % (len(params), len(moments)))
    if not results or results[0][1] != "loss" or results[0][0] != "f32":
        raise Failure("first result is not an f32 scalar 'loss': %s" % (results[:1],))
    argtype = {s: t for _, t, s, _ in states}
    argtype.update({p: t for _, t, p in params})
    bad = ["%s: %s, arg %s" % (u, t, argtype.get(u)) for t, _, u in results if u and t != argtype.get(u)]
    if bad:
        raise Failure("update outputs do not have their argument's type: %s" % ", ".join(bad[:5]))
    # the loss: the returned value's defining op
    ret = re.search(r"^\s*return\s+(%[\w#]+)", text, re.M)
    loss_def = [o for o in ops if ret and o[0] and o[0].split(",")[0].strip() == ret.group(1)]
    loss_low = None
    if not loss_def:
        # the loss may be produced by a non-dlopt op; then only its type is known
        loss_desc = "loss %s" % ret.group(1) if ret else "loss ?"
    else:
        _, name, ins, outs, _, line = loss_def[0]
        if [elem(t) for t in outs] != ["f32"]:
            raise Failure("the loss is produced in %s: %s" % (outs, line))
        if name == "cast" and ins and elem(ins[0]) != "f32":
            loss_low = line
            loss_desc = "loss cast from %s" % elem(ins[0])
        else:
            loss_desc = "loss from f32 %s" % name
    if loss_low and loss_must_be_f32:
        raise Failure("the loss is computed in %s and cast to f32: %s" % (low, loss_low))
    mm = [o for o in ops if o[1] == "matmul"]
    if not mm:
        raise Failure("no matmul in the IR")
    bad = [o[5] for o in mm if any(elem(t) != low for t in o[2] + o[3])]
    if bad:
        raise Failure("%d of %d matmuls not in %s, e.g. %s" % (len(bad), len(mm), low, bad[0][:200]))
    keep = ("softmax", "log_softmax", "sum", "mean", "cross_entropy", "mse")
    fwd_keep = [o for o in ops if o[1] in keep and o[4]]

    def on_f32(o):
        # cross_entropy reads narrow logits as f32 and computes in f32
        # (dlopt-fold-loss-casts): only its loss must be f32.
        if o[1] == "cross_entropy":
            return [elem(t) for t in o[3]] == ["f32"]
        return not any(is_float(elem(t)) and elem(t) != "f32" for t in o[2] + o[3])
    bad = [o[5] for o in fwd_keep if not on_f32(o)]
    if bad:
        raise Failure("forward op not on f32: %s" % bad[0][:200])
    seen = sorted(set(o[1] for o in fwd_keep))
    missing = [n for n in need_ops if n not in seen]
    if missing:
        raise Failure("expected forward ops %s in the IR, missing %s" % (need_ops, missing))
    casts = sum(1 for o in ops if o[1] == "cast" and o[3] and elem(o[3][0]) == low)
    bwd_low_red = [o for o in ops if o[1] in keep and not o[4] and any(elem(t) == low for t in o[2] + o[3])]
    det = ("%d params + %d float states f32, %d matmuls (%d forward) %s, %s, forward %s on f32, "
           "%d casts to %s" % (
               len(params), sum(1 for _, t, _, _ in states if is_float(elem(t))), len(mm),
               sum(1 for o in mm if o[4]), low, loss_desc, "/".join(seen), casts, low))
    if bwd_low_red:
        det += "; note: %d backward reductions in %s (%s)" % (
            len(bwd_low_red), low, ", ".join(sorted(set(o[1] for o in bwd_low_red))))
    return det, args, states


def emit_mlir(ctx, src, extra, out):
    ctx.tool("compile", TRAIN + extra + [src, "--emit=mlir", "-o", out, "--quiet"])
    with open(out) as f:
        return f.read()


def gen(ctx, args, out):
    if not os.path.exists(out):
        ctx.tool("gen", args + ["-q", "-o", out])
    return out


# ------------------------------------------------------ shared GPT training

def shared_gpt(ctx):
    """The 2-layer GPT (with and without dropout) and the Markov corpus, in WORK/shared."""
    d = os.path.join(ctx.work, "shared")
    if "gpt" not in ctx.shared:
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng([ctx.seed, 7])
        toks, _ = markov_corpus(rng, 64, 12000)
        np.save(os.path.join(d, "train.npy"), toks.astype(np.int32))
        gen(ctx, GPT, os.path.join(d, "gpt.mlir"))
        gen(ctx, GPT + ["--dropout", "0.1"], os.path.join(d, "gpt_dropout.mlir"))
        ctx.shared["gpt"] = d
    return d


def train_gpt(ctx, precision, recompute="none", dropout=False, steps=STEPS, ckpt=True):
    """Compile and train; memoized. Returns (metrics list, final checkpoint tensors, plan summary)."""
    key = (precision, recompute, dropout, steps)
    if key in ctx.shared:
        return ctx.shared[key]
    d = shared_gpt(ctx)
    tag = "%s_%s%s_%d" % (precision, recompute, "_drop" if dropout else "", steps)
    src = os.path.join(d, "gpt_dropout.mlir" if dropout else "gpt.mlir")
    plan = os.path.join(d, tag + ".plan")
    r = ctx.tool("compile", TRAIN + ["--precision", precision, "--recompute", recompute, src, "-o", plan])
    metrics = os.path.join(d, tag + ".jsonl")
    ck = os.path.join(d, tag + ".ck")
    for p in (metrics, ck):
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    ctx.tool("run", [plan, "--steps", str(steps), "--data", os.path.join(d, "train.npy"),
                     "--metrics", metrics, "--checkpoint-dir", ck, "--seed", str(ctx.seed % 100000),
                     "--quiet"], timeout=600)
    m = read_jsonl(metrics)
    if [x["step"] for x in m] != list(range(1, steps + 1)):
        raise Failure("%s: metrics steps %s..." % (tag, [x["step"] for x in m][:5]))
    tensors, meta = read_safetensors(os.path.join(ck, "step-%06d.safetensors" % steps))
    res = (m, tensors, r.stdout.strip() + r.stderr.strip())
    ctx.shared[key] = res
    return res


def losses(m):
    out = []
    for x in m:
        if x["loss"] is None or not math.isfinite(x["loss"]):
            raise Failure("step %d: non-finite loss %r" % (x["step"], x["loss"]))
        out.append(x["loss"])
    return np.array(out, np.float64)


# ------------------------------------------------------------------ checks

def ir_bf16_gpt(ctx):
    d = shared_gpt(ctx)
    text = emit_mlir(ctx, os.path.join(d, "gpt.mlir"), ["--precision", "bf16"], ctx.path("gpt.bf16.mlir"))
    det, _, _ = check_mixed_ir(text, "bf16", ["cross_entropy"])
    return det


FP32_OPS_MLIR = """\
// Two layers of unfused attention-like blocks, then a composite loss:
// 0.001 * (cross_entropy + mse - 0.001 * mean(sum(log_softmax))). The factor
// 0.001 keeps every gradient far below fp16 overflow even at scale 65536.
func.func @main(%x: tensor<4x16x8xf32> {dlopt.input = "x"},
                %y: tensor<4x16x8xf32> {dlopt.input = "y"},
                %labels: tensor<64xi32> {dlopt.input = "labels"},
                %w0: tensor<8x8xf32> {dlopt.param = "l0.w", dlopt.init = {dist = "normal", std = 0.5 : f64}},
                %w1: tensor<8x8xf32> {dlopt.param = "l1.w", dlopt.init = {dist = "normal", std = 0.5 : f64}})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %q0 = dlopt.matmul %x, %w0 {dlopt.layer = 0 : i64} : tensor<4x16x8xf32>, tensor<8x8xf32> -> tensor<4x16x8xf32>
  %s0 = dlopt.matmul %q0, %x {dlopt.layer = 0 : i64, transpose_b} : tensor<4x16x8xf32>, tensor<4x16x8xf32> -> tensor<4x16x16xf32>
  %p0 = dlopt.softmax %s0 dim = 2 {dlopt.layer = 0 : i64} : tensor<4x16x16xf32>
  %o0 = dlopt.matmul %p0, %q0 {dlopt.layer = 0 : i64} : tensor<4x16x16xf32>, tensor<4x16x8xf32> -> tensor<4x16x8xf32>
  %t0 = dlopt.tanh %o0 {dlopt.layer = 0 : i64} : tensor<4x16x8xf32>
  %h0 = dlopt.add %t0, %x {dlopt.layer = 0 : i64} : tensor<4x16x8xf32>, tensor<4x16x8xf32> -> tensor<4x16x8xf32>
  %q1 = dlopt.matmul %h0, %w1 {dlopt.layer = 1 : i64} : tensor<4x16x8xf32>, tensor<8x8xf32> -> tensor<4x16x8xf32>
  %s1 = dlopt.matmul %q1, %h0 {dlopt.layer = 1 : i64, transpose_b} : tensor<4x16x8xf32>, tensor<4x16x8xf32> -> tensor<4x16x16xf32>
  %p1 = dlopt.softmax %s1 dim = 2 {dlopt.layer = 1 : i64} : tensor<4x16x16xf32>
  %o1 = dlopt.matmul %p1, %q1 {dlopt.layer = 1 : i64} : tensor<4x16x16xf32>, tensor<4x16x8xf32> -> tensor<4x16x8xf32>
  %t1 = dlopt.tanh %o1 {dlopt.layer = 1 : i64} : tensor<4x16x8xf32>
  %h1 = dlopt.add %t1, %h0 {dlopt.layer = 1 : i64} : tensor<4x16x8xf32>, tensor<4x16x8xf32> -> tensor<4x16x8xf32>
  %lg = dlopt.reshape %h1 : tensor<4x16x8xf32> -> tensor<64x8xf32>
  %ce = dlopt.cross_entropy %lg, %labels : tensor<64x8xf32>, tensor<64xi32> -> tensor<f32>
  %ls = dlopt.log_softmax %h1 dim = 2 : tensor<4x16x8xf32>
  %rs = dlopt.sum %ls dims = [2] : tensor<4x16x8xf32> -> tensor<4x16xf32>
  %mn = dlopt.mean %rs dims = [0, 1] : tensor<4x16xf32> -> tensor<f32>
  %ms = dlopt.mse %h1, %y : tensor<4x16x8xf32>, tensor<4x16x8xf32> -> tensor<f32>
  %c = arith.constant dense<-0.001> : tensor<f32>
  %mc = dlopt.mul %mn, %c : tensor<f32>, tensor<f32> -> tensor<f32>
  %a1 = dlopt.add %ce, %ms : tensor<f32>, tensor<f32> -> tensor<f32>
  %a2 = dlopt.add %a1, %mc : tensor<f32>, tensor<f32> -> tensor<f32>
  %k = arith.constant dense<0.001> : tensor<f32>
  %loss = dlopt.mul %a2, %k : tensor<f32>, tensor<f32> -> tensor<f32>
  return %loss : tensor<f32>
}
"""


def fp32_ops_model(ctx):
    p = os.path.join(ctx.work, "shared", "fp32_ops.mlir")
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(FP32_OPS_MLIR)
    return p


def ir_bf16_fp32_ops(ctx):
    src = fp32_ops_model(ctx)
    text = emit_mlir(ctx, src, ["--precision", "bf16"], ctx.path("ops.bf16.mlir"))
    det, _, _ = check_mixed_ir(text, "bf16", ["softmax", "log_softmax", "sum", "mean", "cross_entropy", "mse"],
                               loss_must_be_f32=False)   # checked by composite_loss.bf16
    # and the plan runs (3 steps on synthetic data)
    ctx.tool("compile", TRAIN + ["--precision", "bf16", src, "-o", ctx.path("ops.bf16.plan"), "--quiet"])
    ctx.tool("run", [ctx.path("ops.bf16.plan"), "--steps", "3", "--metrics", ctx.path("m.jsonl"), "--quiet"])
    ls = losses(read_jsonl(ctx.path("m.jsonl")))
    return det + "; 3 steps run, loss %.4f -> %.4f" % (ls[0], ls[-1])


def ir_fp16_gpt(ctx):
    d = shared_gpt(ctx)
    text = emit_mlir(ctx, os.path.join(d, "gpt.mlir"), ["--precision", "fp16"], ctx.path("gpt.fp16.mlir"))
    det, args, states = check_mixed_ir(text, "f16", ["cross_entropy"])
    st = {s: (t, a) for _, t, s, a in states}
    if "loss_scale" not in st or "loss_scale.good_steps" not in st:
        raise Failure("no loss_scale / loss_scale.good_steps state: %s" % sorted(st)[:6])
    t, a = st["loss_scale"]
    if t != "f32":
        raise Failure("loss_scale is %s, expected a scalar f32" % t)
    m = re.search(r'dist = "constant", value = ([0-9.eE+-]+)', a)
    if not m or float(m.group(1)) != INIT_SCALE:
        raise Failure("loss_scale init is not constant 65536: %s" % a.strip())
    if st["loss_scale.good_steps"][0] != "i64":
        raise Failure("loss_scale.good_steps is %s, expected i64" % st["loss_scale.good_steps"][0])
    # the f32 step has no loss scaling
    t32 = emit_mlir(ctx, os.path.join(d, "gpt.mlir"), ["--precision", "f32"], ctx.path("gpt.f32.mlir"))
    if "loss_scale" in t32 or "bf16" in t32 or "f16>" in t32 or re.search(r"xf16", t32):
        raise Failure("--precision f32 step has low-precision values or loss scaling")
    return det + "; loss_scale f32 init 65536, good_steps i64; f32 step has neither casts nor scaling"


def tracks_f32(ctx, low):
    m32, t32, _ = train_gpt(ctx, "f32")
    mlo, tlo, _ = train_gpt(ctx, low)
    l32, llo = losses(m32), losses(mlo)
    gap = np.abs(llo - l32) / l32
    worst = int(np.argmax(gap))
    final = abs(llo[-1] - l32[-1]) / l32[-1]
    same_steps = int(np.sum(llo == l32))
    params = [k for k in t32 if not k.startswith("adamw.") and k not in ("step",) and not k.startswith("loss_scale")]
    pdiff = max(float(np.max(np.abs(tlo[k].astype(np.float64) - t32[k]))) for k in params)
    det = ("loss f32 %.4f -> %.4f, %s %.4f -> %.4f; max step gap %.3g%% (step %d), final gap %.3g%%, "
           "%d/%d steps bitwise equal, max |param diff| %.3g" % (
               l32[0], l32[-1], low, llo[0], llo[-1], 100 * gap.max(), worst + 1, 100 * final,
               same_steps, len(l32), pdiff))
    if gap.max() > STEP_TOL:
        raise Failure("step %d: |loss_%s - loss_f32| = %.4g > %.0f%% of %.4f: %s" % (
            worst + 1, low, abs(llo[worst] - l32[worst]), 100 * STEP_TOL, l32[worst], det))
    if final > FINAL_TOL[low]:
        raise Failure("final losses differ by %.3g%% > %.0f%%: %s" % (100 * final, 100 * FINAL_TOL[low], det))
    if same_steps == len(l32) and pdiff == 0:
        raise Failure("%s run is bitwise equal to f32 (the precision flag changed nothing): %s" % (low, det))
    if l32[-1] > 0.6 * l32[0]:
        raise Failure("f32 baseline did not learn: %s" % det)
    return det, mlo, tlo


def bf16_tracks(ctx):
    det, _, _ = tracks_f32(ctx, "bf16")
    return det


def fp16_tracks(ctx):
    det, m16, t16 = tracks_f32(ctx, "fp16")
    scales = [x.get("loss_scale") for x in m16]
    if any(s is None for s in scales):
        raise Failure("fp16 metrics lines without loss_scale: %s" % det)
    # skipped steps, from the scale (the metrics' "skipped" field is checked by fp16.overflow.reported)
    skipped = sum(1 for a, b in zip([INIT_SCALE] + scales, scales) if b == a / 2)
    # loss_scale at the start: a 1-step run's checkpoint (no skip, no growth after 1 good step)
    d = shared_gpt(ctx)
    plan = os.path.join(d, "fp16_none_%d.plan" % STEPS)
    ctx.tool("run", [plan, "--steps", "1", "--data", os.path.join(d, "train.npy"), "--checkpoint-dir",
                     ctx.path("ck1"), "--metrics", ctx.path("m1.jsonl"), "--seed", str(ctx.seed % 100000),
                     "--quiet"])
    t1, meta = read_safetensors(ctx.path("ck1", "step-000001.safetensors"))
    ls, good, step = float(t1["loss_scale"]), int(t1["loss_scale.good_steps"]), int(t1["step"])
    m1 = read_jsonl(ctx.path("m1.jsonl"))[0]
    det += "; loss_scale after step 1: %g (good_steps %d, step %d), after %d steps %g (good_steps %d), " \
           "%d skipped" % (ls, good, step, STEPS, float(t16["loss_scale"]), int(t16["loss_scale.good_steps"]),
                           skipped)
    if t1["loss_scale"].dtype != np.float32 or t1["loss_scale"].shape != ():
        raise Failure("loss_scale in the checkpoint is %s %s, expected a f32 scalar" % (
            t1["loss_scale"].dtype, t1["loss_scale"].shape))
    if not (ls == INIT_SCALE and good == 1 and step == 1 and m1.get("grad_norm") is not None):
        raise Failure("after one good step expected loss_scale 65536, good_steps 1, step 1: " + det)
    if m1.get("loss_scale") != INIT_SCALE:
        raise Failure("metrics loss_scale of step 1 is %r: %s" % (m1.get("loss_scale"), det))
    return det


def bf16_exact(v):
    """v (a float32 value) is exactly representable in bf16."""
    return (int(np.array([v], np.float32).view(np.uint32)[0]) & 0xFFFF) == 0


def composite_run(ctx, precision, steps):
    src = fp32_ops_model(ctx)
    plan = ctx.path("ops.%s.plan" % precision)
    ctx.tool("compile", TRAIN + ["--precision", precision, src, "-o", plan, "--quiet"])
    mj = ctx.path("ops.%s.jsonl" % precision)
    ctx.tool("run", [plan, "--steps", str(steps), "--metrics", mj, "--seed", str(ctx.seed % 100000), "--quiet"])
    return read_jsonl(mj)


def loss_chain_low(text, low):
    """Forward scalar ops computing in `low` (the arithmetic combining f32 loss terms)."""
    return [o[5] for o in parse_ops(text) if o[4] and o[1] != "cast" and o[3] == [low]]


def composite_loss_bf16(ctx):
    """A loss combining f32 reductions (ce + mse + mean) must stay f32 at bf16."""
    src = fp32_ops_model(ctx)
    text = emit_mlir(ctx, src, ["--precision", "bf16"], ctx.path("ops.bf16.mlir"))
    det, _, _ = check_mixed_ir(text, "bf16", [], loss_must_be_f32=False)
    chain = loss_chain_low(text, "bf16")
    n = 5
    l32 = [x["loss"] for x in composite_run(ctx, "f32", n)]
    lbf = [x["loss"] for x in composite_run(ctx, "bf16", n)]
    ex32, exbf = sum(map(bf16_exact, l32)), sum(map(bf16_exact, lbf))
    info = ("%d forward scalar ops on bf16 (e.g. '%s'), %s; reported losses f32 plan %s, bf16 plan %s "
            "(%d/%d and %d/%d exactly representable in bf16)" % (
                len(chain), chain[0][:110] if chain else "-", re.search(r"loss [^,]*", det).group(0),
                ["%.7g" % v for v in l32[:3]], ["%.7g" % v for v in lbf[:3]], ex32, n, exbf, n))
    if chain or "loss cast from" in det or exbf == n:
        raise Failure("the loss is not kept in f32: the f32 cross_entropy/mse/mean results are combined in "
                      "bf16 and the loss is a bf16 value cast to f32: " + info)
    return info


def composite_loss_fp16(ctx):
    """With fp16 and a composite loss, the initial scale 65536 must not overflow the backward seed."""
    src = fp32_ops_model(ctx)
    text = emit_mlir(ctx, src, ["--precision", "fp16"], ctx.path("ops.fp16.mlir"))
    args, _ = parse_signature(text)
    ls = [n for n, t, a in args if attr_str(a, "dlopt.state") == "loss_scale"]
    if not ls:
        raise Failure("no loss_scale state")
    casts = [o[5] for o in parse_ops(text)
             if o[1] == "cast" and re.search(r"dlopt\.cast %s\b" % re.escape(ls[0]), o[5])
             and o[3] and elem(o[3][0]) == "f16"]
    m32 = composite_run(ctx, "f32", 3)
    m16 = composite_run(ctx, "fp16", 3)
    g32 = m32[0]["grad_norm"]
    if g32 is None or g32 * INIT_SCALE > FP16_MAX / 10:
        raise Failure("harness: gradients not small enough for the premise (f32 grad_norm %r)" % g32)
    first = m16[0]
    info = ("f32 plan step 1 grad_norm %.3g (x 65536 = %.3g << 65504); fp16 step 1: loss_scale after %r, "
            "grad_norm %r, skipped %r; loss_scale cast to f16 in the backward: %s" % (
                g32, g32 * INIT_SCALE, first.get("loss_scale"), first.get("grad_norm"), first.get("skipped"),
                casts[0][:110] if casts else "none"))
    if first.get("loss_scale") != INIT_SCALE or first.get("grad_norm") is None:
        raise Failure("step 1 overflowed and was skipped although every gradient is tiny: the backward is "
                      "seeded with the loss scale cast to f16 (65536 -> inf): " + info)
    if casts:
        raise Failure("the loss scale is cast to f16 (65536 is not representable): " + info)
    return info


# ------------------------------------------------------------ fp16 overflow

MLP_GEN = ["mlp", "--in", "8", "--hidden", "16", "--layers", "1", "--classes", "4", "--batch", "8",
           "--activation", "relu"]
OVF_STEPS = 6


def mlp_grads(P, x, y):
    """float64 loss and gradients of dlopt-gen's 1-hidden-layer relu MLP with mean cross-entropy."""
    W0, b0, W1, b1 = (P[k].astype(np.float64) for k in ("fc0.weight", "fc0.bias", "head.weight", "head.bias"))
    x = x.astype(np.float64)
    z = x @ W0 + b0
    h = np.maximum(z, 0)
    lg = h @ W1 + b1
    mx = lg.max(1, keepdims=True)
    e = np.exp(lg - mx)
    p = e / e.sum(1, keepdims=True)
    n = x.shape[0]
    loss = float(np.mean(-(np.log(p[np.arange(n), y]))))
    d = p.copy()
    d[np.arange(n), y] -= 1
    d /= n
    g = {"head.weight": h.T @ d, "head.bias": d.sum(0)}
    dh = (d @ W1.T) * (z > 0)
    g["fc0.weight"] = x.T @ dh
    g["fc0.bias"] = dh.sum(0)
    return loss, g, float(np.abs(lg).max())


def overflow_run(ctx):
    """Runs the overflow scenario once (shared by the two overflow checks)."""
    if "overflow" in ctx.shared:
        return ctx.shared["overflow"]
    d = os.path.join(ctx.work, "shared", "overflow")
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    P = {"fc0.weight": ctx.rng.uniform(-0.35, 0.35, (8, 16)), "fc0.bias": ctx.rng.uniform(-0.35, 0.35, 16),
         "head.weight": ctx.rng.uniform(-0.25, 0.25, (16, 4)), "head.bias": ctx.rng.uniform(-0.25, 0.25, 4)}
    P = {k: v.astype(np.float32) for k, v in P.items()}
    y = ctx.rng.integers(0, 4, 8).astype(np.int32)
    z = ctx.rng.standard_normal((8, 8))
    # inputs ~10: the forward stays far inside fp16 (|x|, |logits| << 65504), but
    # some unscaled gradient is > 2 x 65504 / 65536, so the first step must overflow.
    for amp in (10.0, 20.0, 40.0, 80.0):
        x = (z * amp).astype(np.float32)
        loss, g, maxlogit = mlp_grads(P, x, y)
        gmax = max(float(np.abs(v).max()) for v in g.values())
        if gmax * INIT_SCALE > 2 * FP16_MAX:
            break
    else:
        raise Failure("harness: could not construct an overflowing input (max |g| %.3g)" % gmax)
    if not (math.isfinite(loss) and maxlogit < 1000 and float(np.abs(x).max()) < 1000):
        raise Failure("harness: forward not safely finite in fp16 (loss %r, max |logit| %.3g)" % (loss, maxlogit))
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "y.npy"), y)
    binds = []
    for k, v in P.items():
        f = os.path.join(d, k + ".npy")
        np.save(f, v)
        binds += ["--input", "%s=%s" % (k, f)]
    gen(ctx, MLP_GEN, os.path.join(d, "mlp.mlir"))
    ctx.tool("compile", TRAIN + ["--precision", "fp16", os.path.join(d, "mlp.mlir"),
                                 "-o", os.path.join(d, "mlp.plan"), "--quiet"])
    r = ctx.tool("run", [os.path.join(d, "mlp.plan"), "--steps", str(OVF_STEPS),
                         "--data-input", "x=" + os.path.join(d, "x.npy"),
                         "--data-input", "labels=" + os.path.join(d, "y.npy"),
                         "--metrics", os.path.join(d, "m.jsonl"), "--checkpoint-dir", os.path.join(d, "ck"),
                         "--checkpoint-every", "1", "--log-every", "1", "--seed", str(ctx.seed % 100000)] + binds,
                 check=False)
    res = {"P": P, "amp": amp, "gmax": gmax, "loss": loss, "maxlogit": maxlogit, "dir": d, "rc": r.returncode,
           "stderr": r.stderr, "stdout": r.stdout}
    if r.returncode == 0:
        res["metrics"] = read_jsonl(os.path.join(d, "m.jsonl"))
        res["ck"] = [read_safetensors(os.path.join(d, "ck", "step-%06d.safetensors" % k))[0]
                     for k in range(1, OVF_STEPS + 1)]
    ctx.shared["overflow"] = res
    return res


def classify_overflow(res):
    """Per step: (skipped?, checkpoint). Raises on any inconsistency of the plan's skip logic."""
    if res["rc"] != 0:
        raise Failure("dlopt-run stopped with rc %d on an overflowing fp16 step: %s" % (
            res["rc"], res["stderr"].strip()[-400:]))
    m, cks = res["metrics"], res["ck"]
    if [x["step"] for x in m] != list(range(1, OVF_STEPS + 1)):
        raise Failure("metrics steps %s, expected 1..%d (training must not stop)" % ([x["step"] for x in m],
                                                                                      OVF_STEPS))
    prev = dict(res["P"])
    prev.update({"step": np.int64(0), "loss_scale": np.float32(INIT_SCALE), "loss_scale.good_steps": np.int64(0)})
    for k in cks[0]:
        if k.startswith("adamw."):
            prev[k] = np.zeros_like(cks[0][k])
    steps = []
    for i, ck in enumerate(cks):
        n = i + 1
        if m[i]["loss"] is None or not math.isfinite(m[i]["loss"]):
            raise Failure("step %d: loss %r is not finite (the forward must stay finite)" % (n, m[i]["loss"]))
        s0, s1 = float(prev["loss_scale"]), float(ck["loss_scale"])
        skipped = s1 == s0 / 2
        if skipped:
            changed = [k for k in ck if not k.startswith("loss_scale") and
                       np.asarray(ck[k]).tobytes() != np.asarray(prev[k]).astype(ck[k].dtype).tobytes()]
            if changed:
                raise Failure("step %d skipped (scale %g -> %g) but changed %s" % (n, s0, s1, changed[:6]))
            if int(ck["loss_scale.good_steps"]) != 0:
                raise Failure("step %d skipped but good_steps is %d" % (n, int(ck["loss_scale.good_steps"])))
        else:
            if s1 != s0:
                raise Failure("step %d: loss_scale %g -> %g, neither kept nor halved" % (n, s0, s1))
            if int(ck["step"]) != int(prev["step"]) + 1:
                raise Failure("step %d applied but the step state went %d -> %d" % (
                    n, int(prev["step"]), int(ck["step"])))
            moved = [k for k in res["P"] if ck[k].tobytes() != np.asarray(prev[k]).tobytes()]
            if not moved:
                raise Failure("step %d applied (scale kept) but no param changed" % n)
        steps.append((skipped, s1, int(ck["step"])))
        prev = ck
    return steps


def fp16_overflow_skip(ctx):
    res = overflow_run(ctx)
    steps = classify_overflow(res)
    nskip = sum(1 for s in steps if s[0])
    det = ("x ~ %g N(0,1), loss %.3f, max |logit| %.1f, float64 max |grad| %.3g (x 65536 = %.3g > 65504); "
           "per step (skipped, scale, step state): %s" % (
               res["amp"], res["loss"], res["maxlogit"], res["gmax"], res["gmax"] * INIT_SCALE,
               " ".join("%s/%g/%d" % ("S" if s else "ok", sc, st) for s, sc, st in steps)))
    if not steps[0][0]:
        raise Failure("step 1 must overflow at scale 65536 and be skipped: " + det)
    if nskip == len(steps):
        raise Failure("every step was skipped; no update after the scale went down: " + det)
    return det


def fp16_overflow_reported(ctx):
    res = overflow_run(ctx)
    steps = classify_overflow(res)
    m = res["metrics"]
    bad = []
    for i, (skipped, scale, _) in enumerate(steps):
        x = m[i]
        if skipped and x.get("skipped") is not True:
            bad.append("step %d (scale %g -> %g, params unchanged) has no \"skipped\": true" % (
                i + 1, scale * 2, scale))
        if not skipped and x.get("skipped"):
            bad.append("step %d applied but reported skipped" % (i + 1))
        if x.get("loss_scale") != scale:
            bad.append("step %d: metrics loss_scale %r, checkpoint %g" % (i + 1, x.get("loss_scale"), scale))
    lines = {int(mm.group(1)): l for l in res["stderr"].splitlines() for mm in [re.match(r"step (\d+)/", l)] if mm}
    for i, (skipped, _, _) in enumerate(steps):
        if skipped and "skipped" not in lines.get(i + 1, ""):
            bad.append("progress line of step %d does not say skipped: %r" % (i + 1, lines.get(i + 1, "")[:120]))
    nskip = sum(1 for s in steps if s[0])
    if bad:
        raise Failure("%d skipped steps (finite loss, overflowing gradients), not reported: %s; metrics line 1: %s" % (
            nskip, "; ".join(bad[:4]), {k: v for k, v in m[0].items() if k in ("step", "loss", "grad_norm",
                                                                                 "loss_scale", "skipped")}))
    return "%d skipped steps reported in metrics and progress" % nskip


# ----------------------------------------------------------------- recompute

MEM_UNITS = {"B": 1, "bytes": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}


def planned_memory(ctx, src, policy, extra=()):
    plan = ctx.path("%s.%s.plan" % (os.path.basename(src).rsplit(".", 1)[0], policy))
    r = ctx.tool("compile", TRAIN + list(extra) + ["--recompute", policy, src, "-o", plan])
    s = r.stdout + r.stderr
    mm = re.search(r"(\d+) instructions.*planned memory ([\d.]+) (\w+) \(persistent ([\d.]+) (\w+), "
                   r"scratch ([\d.]+) (\w+)\)", s)
    if not mm:
        raise Failure("cannot read the planned memory from: %s" % s.strip()[:300])
    instr = int(mm.group(1))
    scratch = float(mm.group(6)) * MEM_UNITS[mm.group(7)]
    dump = ctx.tool("run", [plan, "--dump"]).stdout
    md = re.search(r"memory of program 0: .*\((\d+) bytes", dump)
    if not md:
        raise Failure("no memory line in dlopt-run --dump")
    text = emit_mlir(ctx, src, list(extra) + ["--recompute", policy], plan[:-5] + ".mlir")
    clones = [o for o in parse_ops(text) if "dlopt.recompute" in o[5]]
    return {"instr": instr, "scratch": scratch, "total": int(md.group(1)), "clones": len(clones),
            "cloned": sorted(set(o[1] for o in clones)), "plan": plan}


def mib(b):
    return "%.2f MiB" % (b / 1024.0 ** 2)


def recompute_memory(ctx):
    src = gen(ctx, GPT_DEEP, ctx.path("gpt6.mlir"))
    f = {p: planned_memory(ctx, src, p) for p in ("none", "selective", "elementwise", "alternate", "full")}
    det = "6-layer GPT seq 128 dropout 0.1: " + "; ".join(
        "%s scratch %s total %s (%d instr, %d clones)" % (p, mib(v["scratch"]), mib(v["total"]), v["instr"],
                                                          v["clones"]) for p, v in f.items())
    if f["none"]["clones"]:
        raise Failure("--recompute none cloned ops: " + det)
    if not f["full"]["clones"]:
        raise Failure("--recompute full cloned nothing: " + det)
    if not (f["full"]["scratch"] < f["none"]["scratch"] and f["full"]["total"] < f["none"]["total"]):
        raise Failure("full does not plan less memory than none: " + det)
    if not (f["selective"]["scratch"] <= f["none"]["scratch"] and f["selective"]["total"] <= f["none"]["total"]):
        raise Failure("selective plans more memory than none: " + det)
    if not (f["full"]["scratch"] < f["elementwise"]["scratch"] < f["none"]["scratch"]):
        raise Failure("elementwise does not plan between full and none: " + det)
    if not (f["full"]["scratch"] < f["alternate"]["scratch"] < f["elementwise"]["scratch"]):
        raise Failure("alternate does not plan between full and elementwise: " + det)
    return det + "; full/none total = %.2f" % (f["full"]["total"] / float(f["none"]["total"]))


def same_runs(runs, label):
    """runs: {policy: (metrics, tensors, summary)}; all bitwise equal to the first."""
    names = list(runs)
    m0, t0, _ = runs[names[0]]
    l0 = losses(m0)
    if len(set(l0.tolist())) < len(l0) // 2:
        raise Failure("%s: losses barely change: %s" % (label, l0[:6]))
    for n in names[1:]:
        m, t, _ = runs[n]
        for a, b in zip(m0, m):
            for k in ("loss", "grad_norm", "lr"):
                if a.get(k) != b.get(k):
                    raise Failure("%s: step %d %s differs: %s %r vs %s %r" % (
                        label, a["step"], k, names[0], a.get(k), n, b.get(k)))
        if sorted(t) != sorted(t0):
            raise Failure("%s: checkpoint tensors differ between %s and %s" % (label, names[0], n))
        diff = [k for k in t0 if t0[k].tobytes() != t[k].tobytes()]
        if diff:
            k = diff[0]
            raise Failure("%s: final %s differs between %s and %s (max |diff| %.3g; %d tensors differ)" % (
                label, k, names[0], n, float(np.max(np.abs(t0[k].astype(np.float64) - t[k]))), len(diff)))
    return "%s: %d steps, loss %.5g -> %.5g, per-step loss/grad_norm and %d checkpoint tensors bitwise equal " \
           "across %s" % (label, len(l0), l0[0], l0[-1], len(t0), "/".join(names))


def recompute_bitwise(ctx):
    runs = {p: train_gpt(ctx, "f32", p, dropout=True, steps=RC_STEPS)
            for p in ("none", "selective", "elementwise", "alternate", "full")}
    instr = {p: int(re.search(r"(\d+) instructions", runs[p][2]).group(1)) for p in runs}
    if not instr["full"] > instr["none"]:
        raise Failure("full recompute plan is not larger than none (%s): nothing recomputed" % instr)
    return same_runs(runs, "2-layer GPT dropout 0.1 f32") + " (instructions %s)" % (
        ", ".join("%s %d" % kv for kv in instr.items()))


def recompute_bitwise_bf16(ctx):
    runs = {p: train_gpt(ctx, "bf16", p, dropout=True, steps=RC_STEPS) for p in ("none", "full")}
    return same_runs(runs, "2-layer GPT dropout 0.1 bf16")


def recompute_softmax(ctx):
    src = fp32_ops_model(ctx)
    f = {p: planned_memory(ctx, src, p) for p in ("none", "selective", "full")}
    det = "; ".join("%s scratch %.2f KiB (%d clones: %s)" % (p, v["scratch"] / 1024.0, v["clones"],
                                                             ",".join(v["cloned"]) or "-") for p, v in f.items())
    if "softmax" not in f["selective"]["cloned"] or set(f["selective"]["cloned"]) - {"softmax", "log_softmax",
                                                                                      "dropout"}:
        raise Failure("selective should clone exactly the softmax/log_softmax/dropout results: " + det)
    if not f["full"]["clones"] > f["selective"]["clones"]:
        raise Failure("full should clone more than selective: " + det)
    if not f["full"]["scratch"] < f["none"]["scratch"]:
        raise Failure("full does not plan less scratch than none: " + det)
    runs = {}
    for p, v in f.items():
        mj, ck = ctx.path("%s.jsonl" % p), ctx.path("%s.ck" % p)
        ctx.tool("run", [v["plan"], "--steps", "10", "--metrics", mj, "--checkpoint-dir", ck,
                         "--seed", str(ctx.seed % 100000), "--quiet"])
        runs[p] = (read_jsonl(mj), read_safetensors(os.path.join(ck, "step-000010.safetensors"))[0], "")
    return det + "; " + same_runs(runs, "unfused-attention model")


CASES = [
    ("ir.bf16.gpt", ir_bf16_gpt),
    ("ir.bf16.fp32_ops", ir_bf16_fp32_ops),
    ("ir.fp16.gpt", ir_fp16_gpt),
    ("bf16.tracks_f32", bf16_tracks),
    ("fp16.tracks_f32", fp16_tracks),
    ("composite_loss.bf16", composite_loss_bf16),
    ("composite_loss.fp16", composite_loss_fp16),
    ("fp16.overflow.skip", fp16_overflow_skip),
    ("fp16.overflow.reported", fp16_overflow_reported),
    ("recompute.memory", recompute_memory),
    ("recompute.bitwise", recompute_bitwise),
    ("recompute.bitwise_bf16", recompute_bitwise_bf16),
    ("recompute.softmax", recompute_softmax),
]


def clear_shared(work):
    if os.path.isdir(os.path.join(work, "shared")):
        shutil.rmtree(os.path.join(work, "shared"))


def main():
    shared = {}

    def run_case(name, fn, args, tools, work):
        return harness.run_ctx_case(Ctx(name, args.seed, tools, work, shared), fn)
    return harness.main("check_precision", __doc__, CASES, run_case, "dlopt-check-precision-",
                        "models, plans, metrics and checkpoints", tools=("gen", "compile", "run"),
                        item="check", timed=True, setup=clear_shared)


if __name__ == "__main__":
    sys.exit(main())
