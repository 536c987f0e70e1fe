#!/usr/bin/env python3
"""Optimizer conformance: `dlopt-compile --train` step by step against
NumPy float64 implementations of the published update equations
(dlopt_train_np.py: PyTorch's SGD / Adam / AdamW, clip_grad_norm_, linear
warmup + cosine / linear decay).

The model is linear regression, loss = mse(x @ w + b, y), whose gradient is
computed analytically in NumPy:

    d = 2 (x w + b - y) / (B * O),   grad w = x^T d,   grad b = sum_rows d

Each case compiles the model with --train and the case's options and drives
the single-step plan from Python: step t binds fresh random x, y and the
params and optimizer state written by step t-1 (`--input NAME=FILE` with the
names of the update outputs; step 1 leaves the state unbound, so it must be
zero-initialized). After every step:

  * local: params and state must equal one float64 reference update applied
    to dlopt's own previous params/state (tight: 1e-4 of the update plus f32
    rounding); `lr` must equal the schedule, `grad_norm` the pre-clip global
    norm, `loss` the reference loss, `step` = t exactly;
  * global: after the last step the params must still track a reference
    trajectory computed purely in float64 from the same start (1e-3 of the
    distance travelled).

Gradient accumulation (--accumulate 2 on [2, B, ...] inputs) must give the
update of the full-batch gradient (the mean of the micro-batch gradients),
and match the non-accumulated plan run on the concatenated batch. The
training loop (`dlopt-run --steps N --data-input ...`) must follow the same
reference trajectory (metrics JSONL and the final checkpoint).

  check_optimizers.py [--work-dir DIR] [--seed N] [--filter REGEX] [--list]

Prints one line per case, then `N passed, M failed`; exits 1 on any failure.
"""
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlopt_np import run  # noqa: E402
import harness  # noqa: E402
from harness import Failure  # noqa: E402
from dlopt_train_np import OptConfig, lr_at, opt_step, read_jsonl, read_safetensors  # noqa: E402

IN, OUT = 3, 2


def linreg_mlir(B, acc=1):
    return """func.func @main(%%x: tensor<%(B)dx%(I)dxf32> {dlopt.input = "x"}, %%y: tensor<%(B)dx%(O)dxf32> {dlopt.input = "y"},
                %%w: tensor<%(I)dx%(O)dxf32> {dlopt.param = "w"}, %%b: tensor<%(O)dxf32> {dlopt.param = "b"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %%0 = dlopt.matmul %%x, %%w : tensor<%(B)dx%(I)dxf32>, tensor<%(I)dx%(O)dxf32> -> tensor<%(B)dx%(O)dxf32>
  %%1 = dlopt.add %%0, %%b : tensor<%(B)dx%(O)dxf32>, tensor<%(O)dxf32> -> tensor<%(B)dx%(O)dxf32>
  %%2 = dlopt.mse %%1, %%y : tensor<%(B)dx%(O)dxf32>, tensor<%(B)dx%(O)dxf32> -> tensor<f32>
  return %%2 : tensor<f32>
}
""" % dict(B=B, I=IN, O=OUT)


def linreg_loss_grads(P, x, y):
    """x: [B, IN] or [K, B, IN] (micro-batches: mean of the micro losses/grads)."""
    if x.ndim == 3:
        parts = [linreg_loss_grads(P, x[k], y[k]) for k in range(x.shape[0])]
        K = float(len(parts))
        return (sum(p[0] for p in parts) / K,
                {n: sum(p[1][n] for p in parts) / K for n in P})
    pred = x @ P["w"] + P["b"]
    r = pred - y
    loss = float(np.mean(r * r))
    d = 2.0 * r / r.size
    return loss, {"w": x.T @ d, "b": d.sum(axis=0)}


class Ctx(harness.Ctx):
    def __init__(self, name, seed, tools, work):
        super().__init__(name, seed, tools, work)
        self.notes = []

    def compile(self, B, flags, acc=1, tag="model"):
        src = self.path(tag + ".mlir")
        with open(src, "w") as f:
            f.write(linreg_mlir(B))
        plan = self.path(tag + ".plan")
        extra = ["--accumulate", str(acc)] if acc > 1 else []
        r = run([self.tools["compile"], "--train"] + flags + extra + [src, "-o", plan, "--quiet"])
        if r.returncode != 0:
            raise Failure("dlopt-compile --train %s failed (rc %d): %s" % (
                " ".join(flags + extra), r.returncode, r.stderr.strip()[:500]))
        return plan

    def save(self, name, arr):
        p = self.path(name + ".npy")
        np.save(p, arr)
        return p

    def run_step(self, plan, binds, outdir):
        cmd = [self.tools["run"], plan, "--quiet", "--output-dir", outdir]
        for n, p in binds.items():
            cmd += ["--input", "%s=%s" % (n, p)]
        r = run(cmd)
        if r.returncode != 0:
            raise Failure("dlopt-run failed (rc %d): %s" % (r.returncode, r.stderr.strip()[:500]))
        return {f[:-4]: np.load(os.path.join(outdir, f)) for f in os.listdir(outdir) if f.endswith(".npy")}


def close(got, ref, bound, what):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise Failure("%s: shape %s, expected %s" % (what, got.shape, ref.shape))
    if not np.all(np.isfinite(got)):
        raise Failure("%s: non-finite values" % what)
    err = np.abs(got - ref)
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    if np.any(err > bound):
        k = int(np.argmax(err / bound))
        raise Failure("%s: %d/%d elements off; at flat %d got %.9g, expected %.9g (err %.2e, bound %.2e)" % (
            what, int(np.sum(err > bound)), err.size, k, got.ravel()[k], ref.ravel()[k],
            err.ravel()[k], bound.ravel()[k]))
    return float(np.max(err / bound)) if err.size else 0.0


def init_params(ctx):
    return {"w": ctx.rng.standard_normal((IN, OUT)).astype(np.float32),
            "b": ctx.rng.standard_normal((OUT,)).astype(np.float32)}


def draw_batch(ctx, B, acc=1):
    lead = (acc, B) if acc > 1 else (B,)
    x = ctx.rng.standard_normal(lead + (IN,)).astype(np.float32)
    wt = np.array([[1.0, -2.0], [0.5, 0.0], [-1.0, 3.0]])
    y = (x.astype(np.float64) @ wt + 0.3 + 0.5 * ctx.rng.standard_normal(lead + (OUT,))).astype(np.float32)
    return x, y


def drive(ctx, plan, cfg, steps, B, acc=1, batches=None, tag="run", p0=None, update_rtol=1e-4):
    """Runs `steps` single steps; returns (final dlopt params, list of per-step outputs, batches, worst ratio)."""
    p0 = init_params(ctx) if p0 is None else p0
    cur = {n: ctx.save("%s.init.%s" % (tag, n), a) for n, a in p0.items()}
    dl_p = {n: a.astype(np.float64) for n, a in p0.items()}
    dl_s = {}
    ref_p = dict(dl_p)
    ref_s = {}
    worst = 0.0
    outs = []
    batches = batches or [draw_batch(ctx, B, acc) for _ in range(steps)]
    for t in range(1, steps + 1):
        x, y = batches[t - 1]
        binds = dict(cur)
        binds["x"] = ctx.save("%s.x.%d" % (tag, t), x)
        binds["y"] = ctx.save("%s.y.%d" % (tag, t), y)
        o = ctx.run_step(plan, binds, ctx.path("%s.out.%d" % (tag, t)))
        outs.append(o)
        # local reference: one update from dlopt's own previous params/state
        xr, yr = x.astype(np.float64), y.astype(np.float64)
        loss, grads = linreg_loss_grads(dl_p, xr, yr)
        np_, ns_, lr, norm = opt_step(cfg, dl_p, grads, dl_s, t)
        # The same update on magnitudes: each state's |terms| (b1 |m| +
        # (1-b1) |g|, ...). float32 rounds the terms, so a state that
        # cancels (m of 0.25 against a gradient step of -0.25) is only
        # good to 1e-5 of them, not of its tiny result.
        mag = lambda d: {k: np.abs(a) for k, a in d.items() if k != "step"}
        np_mag, ns_mag, _, _ = opt_step(cfg, mag(dl_p), mag(grads), mag(dl_s), t)
        w = "step %d" % t
        if int(o["step"]) != t or o["step"].dtype != np.int64:
            raise Failure("%s: step output %r (%s), expected %d" % (w, o["step"], o["step"].dtype, t))
        worst = max(worst, close(o["lr"], lr, 2e-6 * cfg.lr + 1e-12, w + " lr"))
        worst = max(worst, close(o["grad_norm"], norm, 1e-5 * norm + 1e-9, w + " grad_norm"))
        worst = max(worst, close(o["loss"], loss, 1e-5 * abs(loss) + 1e-9, w + " loss"))
        for n in dl_p:
            # The update is good to float32 of its terms, not of itself: an
            # Adam m that cancels to almost 0 leaves a tiny step whose
            # rounding is that of the terms (the same update on
            # magnitudes, as for the states).
            bound = 2e-6 * (np.abs(dl_p[n]) + np.abs(np_[n])) + update_rtol * np.abs(np_[n] - dl_p[n]) + \
                2e-6 * np.abs(np_mag[n] - np.abs(dl_p[n])) + 1e-9
            worst = max(worst, close(o[n], np_[n], bound, "%s param %s" % (w, n)))
            for s in cfg.state_names(n):
                if s not in o:
                    raise Failure("%s: no output for state %s (outputs: %s)" % (w, s, sorted(o)))
                ref = ns_[s]
                bound = 1e-5 * np.maximum(np.abs(ref), ns_mag[s]) + 1e-6 * np.abs(ref).max() + 1e-12
                worst = max(worst, close(o[s], ref, bound, "%s state %s" % (w, s)))
        expected_outputs = {"loss", "lr", "grad_norm", "step"} | set(dl_p) | \
            {s for n in dl_p for s in cfg.state_names(n)}
        if set(o) != expected_outputs:
            raise Failure("%s: outputs %s, expected %s" % (w, sorted(o), sorted(expected_outputs)))
        # next step starts from dlopt's outputs (bound by name)
        dl_p = {n: o[n].astype(np.float64) for n in dl_p}
        dl_s = {s: o[s].astype(np.float64) for n in dl_p for s in cfg.state_names(n)}
        cur = {k: os.path.join(ctx.path("%s.out.%d" % (tag, t)), k + ".npy") for k in expected_outputs
               if k not in ("loss", "lr", "grad_norm")}
        # global reference: pure float64 trajectory
        _, rg = linreg_loss_grads(ref_p, xr, yr)
        ref_p, ref_s, _, _ = opt_step(cfg, ref_p, rg, ref_s, t)
    p_start = {n: a.astype(np.float64) for n, a in p0.items()}
    for n in dl_p:
        travel = np.abs(ref_p[n] - p_start[n]).max()
        worst_g = close(dl_p[n], ref_p[n], 1e-3 * travel + 1e-6, "after %d steps (float64 trajectory) %s" % (steps, n))
        ctx.notes.append("traj %.2f" % worst_g)
    return dl_p, outs, batches, worst


# ------------------------------------------------------------------ cases

CASES = []


def add(name, cfg, steps=6, B=8, p_scale=1.0, update_rtol=1e-4):
    def fn(ctx):
        plan = ctx.compile(B, cfg.flags())
        p0 = {n: (a * p_scale).astype(np.float32) for n, a in init_params(ctx).items()}
        _, outs, _, worst = drive(ctx, plan, cfg, steps, B, p0=p0, update_rtol=update_rtol)
        lrs = ", ".join("%.4g" % float(o["lr"]) for o in outs)
        return "%d steps, worst local %.2f of bound; lr %s" % (steps, worst, lrs)
    CASES.append((name, fn))


add("sgd.plain", OptConfig("sgd", lr=0.1))
add("sgd.momentum", OptConfig("sgd", lr=0.05, momentum=0.9))
add("sgd.nesterov", OptConfig("sgd", lr=0.05, momentum=0.9, nesterov=True))
add("sgd.weight_decay", OptConfig("sgd", lr=0.1, weight_decay=0.1))
add("sgd.momentum.weight_decay", OptConfig("sgd", lr=0.05, momentum=0.8, weight_decay=0.05))
add("adam", OptConfig("adam", lr=0.05))
add("adam.l2_decay.betas.eps", OptConfig("adam", lr=0.05, weight_decay=0.1, beta1=0.8, beta2=0.95, eps=0.01))
# Bias correction to f32 precision: params near 0 and lr = 1 make each
# update about 1 (Adam's step is lr * m_hat / sqrt(v_hat)), so a correction
# off by more than a few 1e-7 (1 - pow(f32(beta), t) in f32 was 6.6e-6 off at
# beta2 = 0.999 and 6.8e-4 at 0.99999) shows in the params.
for b1, b2 in ((0.9, 0.999), (0.9, 0.99999), (0.5, 0.9), (0.0, 0.999)):
    add("adam.bias_correction.%g.%g" % (b1, b2),
        OptConfig("adam", lr=1.0, beta1=b1, beta2=b2, eps=1e-12), steps=4, p_scale=1e-3, update_rtol=1e-6)
add("adamw.no_decay", OptConfig("adamw", lr=0.05, weight_decay=0.0))
add("adamw.decay0.2.eps", OptConfig("adamw", lr=0.05, weight_decay=0.2, eps=1e-3))
add("schedule.constant.warmup", OptConfig("adamw", lr=0.05, warmup=3), steps=6)
add("schedule.cosine.warmup", OptConfig("adamw", lr=0.05, schedule="cosine", warmup=3, total=10, min_lr=0.005), steps=12)
add("schedule.linear.warmup", OptConfig("sgd", lr=0.1, schedule="linear", warmup=2, total=8, min_lr=0.01), steps=10)
add("schedule.cosine.no_warmup", OptConfig("sgd", lr=0.1, momentum=0.5, schedule="cosine", total=5), steps=7)
add("schedule.linear.no_warmup.min0", OptConfig("adam", lr=0.05, schedule="linear", total=4), steps=5)
add("clip.active.adamw", OptConfig("adamw", lr=0.05, clip=0.5))
add("clip.active.sgd_momentum", OptConfig("sgd", lr=0.1, momentum=0.9, clip=0.3))
add("clip.inactive", OptConfig("sgd", lr=0.1, clip=1e3))
add("all.adamw.cosine.clip", OptConfig("adamw", lr=0.05, weight_decay=0.1, schedule="cosine", warmup=2, total=6,
                                       min_lr=0.001, clip=1.0), steps=8)


def make_accumulate(cfg, acc=2, B=4, steps=4):
    def fn(ctx):
        plan_acc = ctx.compile(B, cfg.flags(), acc=acc, tag="acc")
        plan_full = ctx.compile(B * acc, cfg.flags(), tag="full")
        p0 = init_params(ctx)
        batches = [draw_batch(ctx, B, acc) for _ in range(steps)]
        # the accumulated plan against the reference (grads = mean of micro-batch grads)
        p_acc, outs_acc, _, worst = drive(ctx, plan_acc, cfg, steps, B, acc, batches=batches, tag="acc", p0=p0)
        # the same data as one batch through the non-accumulated plan
        full = [(x.reshape(B * acc, IN), y.reshape(B * acc, OUT)) for x, y in batches]
        p_full, outs_full, _, _ = drive(ctx, plan_full, cfg, steps, B * acc, batches=full, tag="full", p0=p0)
        for n in p_acc:
            close(p_acc[n], p_full[n], 1e-5 * (1 + np.abs(p_full[n])), "accumulated vs full batch %s" % n)
        for t, (a, f) in enumerate(zip(outs_acc, outs_full), 1):
            close(a["loss"], f["loss"], 1e-5 * abs(float(f["loss"])), "step %d loss accumulated vs full" % t)
            close(a["grad_norm"], f["grad_norm"], 1e-5 * abs(float(f["grad_norm"])),
                  "step %d grad_norm accumulated vs full" % t)
        return "%d steps of %d micro-batches, worst local %.2f of bound; matches the full-batch plan" % (
            steps, acc, worst)
    return fn


CASES.append(("accumulate2.adamw", make_accumulate(OptConfig("adamw", lr=0.05, clip=1.0))))
CASES.append(("accumulate2.sgd_momentum", make_accumulate(OptConfig("sgd", lr=0.1, momentum=0.9))))
CASES.append(("accumulate4.adam", make_accumulate(OptConfig("adam", lr=0.05), acc=4)))


def loop_case(ctx):
    """dlopt-run --steps N on a fixed data set of exactly one batch (so the
    per-epoch shuffle only permutes rows) follows the reference trajectory."""
    cfg = OptConfig("adamw", lr=0.05, weight_decay=0.1, schedule="cosine", warmup=2, total=6, min_lr=0.005, clip=1.0)
    B, steps = 8, 7
    plan = ctx.compile(B, cfg.flags())
    p0 = init_params(ctx)
    x, y = draw_batch(ctx, B)
    binds = {n: ctx.save("init." + n, a) for n, a in p0.items()}
    cmd = [ctx.tools["run"], plan, "--steps", str(steps), "--data-input", "x=%s" % ctx.save("X", x),
           "--data-input", "y=%s" % ctx.save("Y", y), "--metrics", ctx.path("metrics.jsonl"),
           "--checkpoint-dir", ctx.path("ck")]
    for n, p in binds.items():
        cmd += ["--input", "%s=%s" % (n, p)]
    r = run(cmd, timeout=300)
    if r.returncode != 0:
        raise Failure("dlopt-run --steps failed (rc %d): %s" % (r.returncode, r.stderr.strip()[:500]))
    metrics = read_jsonl(ctx.path("metrics.jsonl"))
    if [m.get("step") for m in metrics] != list(range(1, steps + 1)):
        raise Failure("metrics steps %s" % [m.get("step") for m in metrics])
    P = {n: a.astype(np.float64) for n, a in p0.items()}
    S = {}
    xr, yr = x.astype(np.float64), y.astype(np.float64)
    for t in range(1, steps + 1):
        loss, g = linreg_loss_grads(P, xr, yr)
        m = metrics[t - 1]
        close(m["lr"], lr_at(cfg, t), 2e-6 * cfg.lr, "metrics step %d lr" % t)
        close(m["loss"], loss, 1e-4 * abs(loss) + 1e-7, "metrics step %d loss" % t)
        close(m["grad_norm"], np.sqrt(sum(np.sum(v * v) for v in g.values())), 1e-4, "metrics step %d grad_norm" % t)
        P, S, _, _ = opt_step(cfg, P, g, S, t)
    ck = ctx.path("ck", "step-%06d.safetensors" % steps)
    if not os.path.exists(ck):
        raise Failure("no checkpoint %s (have %s)" % (ck, os.listdir(ctx.path("ck")) if os.path.isdir(ctx.path("ck")) else "none"))
    tensors, meta = read_safetensors(ck)
    for n in P:
        travel = np.abs(P[n] - p0[n]).max()
        close(tensors[n], P[n], 1e-3 * travel + 1e-6, "checkpoint param %s" % n)
        for s in cfg.state_names(n):
            close(tensors[s], S[s], 1e-3 * np.abs(S[s]).max() + 1e-9, "checkpoint state %s" % s)
    if int(tensors["step"]) != steps:
        raise Failure("checkpoint step %r" % tensors["step"])
    return "%d steps through the training loop; metrics and checkpoint follow the reference" % steps


CASES.append(("loop.steps.adamw_cosine_clip", loop_case))


def compile_error_case(flags, pattern):
    def fn(ctx):
        src = ctx.path("model.mlir")
        with open(src, "w") as f:
            f.write(linreg_mlir(4))
        r = run([ctx.tools["compile"], "--train"] + flags + [src, "-o", ctx.path("model.plan"), "--quiet"])
        if r.returncode == 0:
            raise Failure("dlopt-compile %s succeeded; expected an error matching /%s/" % (" ".join(flags), pattern))
        if r.returncode < 0 or r.returncode >= 128:
            raise Failure("dlopt-compile crashed (rc %d)" % r.returncode)
        if not re.search(pattern, r.stderr):
            raise Failure("error does not match /%s/: %s" % (pattern, r.stderr.strip()[:300]))
        return "rc %d: %s" % (r.returncode, r.stderr.strip().splitlines()[0][:140] if r.stderr.strip() else "")
    return fn


CASES.append(("error.nesterov_without_momentum", compile_error_case(["--optimizer", "sgd", "--nesterov"], r"nesterov")))
CASES.append(("error.cosine_without_total_steps", compile_error_case(["--schedule", "cosine"], r"total-steps")))
CASES.append(("error.unknown_optimizer", compile_error_case(["--optimizer", "lion"], r"lion|optimizer")))


# ---------------------------------------------------------------- driver

def run_case(name, fn, args, tools, work):
    ctx = Ctx(name, args.seed, tools, work)

    def body(ctx):
        det = fn(ctx)
        if ctx.notes:
            det += "; " + ", ".join(ctx.notes)
        return det
    return harness.run_ctx_case(ctx, body)


def main():
    return harness.main("check_optimizers", __doc__, CASES, run_case, "dlopt-check-opt-",
                        "plans, inputs and outputs of each case")


if __name__ == "__main__":
    sys.exit(main())
