#!/usr/bin/env python3
"""Learning end to end with the dlopt-run training loop (`--steps`).

  gpt.markov   A 2-layer GPT (dlopt-gen gpt, hidden 64, 4 heads, seq 32,
               vocab 64, batch 8) trains with AdamW (warmup + cosine, clip 1)
               on a deterministic token stream from a first-order Markov
               chain over 64 symbols (successor perm[s] with p = 0.9, else
               uniform). Its unigram entropy is ~ln 64 = 4.16 nats, its
               entropy rate ~0.73 nats. Pass: the held-out loss
               (--eval-data) ends below 0.5 x the corpus' unigram entropy
               and within 0.4 nats of the entropy rate (and the first
               step's loss is near ln 64, so it learned).
  mlp.blobs    An MLP (dlopt-gen mlp, 2 hidden layers of 32, 4 classes),
               with a `logits` output added, trains with AdamW on Gaussian
               blobs in 8 dimensions. Pass: held-out accuracy > 0.9, both as
               dlopt-run's evaluation reports it and recomputed in NumPy from
               the params of the final checkpoint.
  resume.gpt_dropout
               A small GPT with dropout: 2N steps in one run and N steps +
               --resume + N steps give bitwise-identical per-step losses
               (metrics JSONL) and a byte-identical final checkpoint.

  check_training.py [--work-dir DIR] [--seed N] [--filter REGEX] [--list]

Prints one line per case, then `N passed, M failed`; exits 1 on any failure.
"""
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Ctx, Failure  # noqa: E402
from dlopt_train_np import read_jsonl, read_safetensors  # noqa: E402


def markov_corpus(rng, V, n, p=0.9):
    perm = rng.permutation(V)
    u = rng.random(n)
    rnd = rng.integers(0, V, size=n)
    s = np.empty(n, np.int64)
    s[0] = 0
    for i in range(1, n):
        s[i] = perm[s[i - 1]] if u[i] < p else rnd[i]
    rate = -(p + (1 - p) / V) * math.log(p + (1 - p) / V) - (V - 1) * ((1 - p) / V) * math.log((1 - p) / V)
    return s, rate


def unigram_entropy(tokens, V):
    c = np.bincount(tokens, minlength=V).astype(np.float64)
    c = c[c > 0] / c.sum()
    return float(-(c * np.log(c)).sum())


def gpt_markov(ctx):
    V, steps = 64, 300
    toks, rate = markov_corpus(ctx.rng, V, 60000)
    train, held = toks[:50000], toks[50000:]
    h1 = unigram_entropy(train, V)
    np.save(ctx.path("train.npy"), train.astype(np.int32))
    np.save(ctx.path("heldout.npy"), held.astype(np.int32))
    ctx.tool("gen", ["gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", str(V),
                     "--batch", "8", "-q", "-o", ctx.path("gpt.mlir")])
    ctx.tool("compile", ["--train", "--optimizer", "adamw", "--lr", "3e-3", "--schedule", "cosine",
                         "--warmup-steps", "20", "--total-steps", str(steps), "--min-lr", "3e-4", "--clip-norm", "1.0",
                         ctx.path("gpt.mlir"), "-o", ctx.path("gpt.plan"), "--quiet"])
    t0 = time.time()
    ctx.tool("run", [ctx.path("gpt.plan"), "--steps", str(steps), "--data", ctx.path("train.npy"),
                     "--eval-data", ctx.path("heldout.npy"), "--eval-every", "100", "--eval-batches", "8",
                     "--metrics", ctx.path("metrics.jsonl"), "--log-every", "50", "--seed", str(ctx.seed % 1000),
                     "--quiet"], timeout=600)
    dt = time.time() - t0
    m = read_jsonl(ctx.path("metrics.jsonl"))
    losses = [r["loss"] for r in m]
    evals = [(r["step"], r["eval_loss"]) for r in m if "eval_loss" in r]
    if len(losses) != steps or not evals:
        raise Failure("metrics: %d steps, %d evaluations" % (len(losses), len(evals)))
    if not all(math.isfinite(l) for l in losses):
        raise Failure("non-finite training loss")
    first, final = losses[0], evals[-1][1]
    det = "unigram H %.3f, entropy rate %.3f nats; loss step 1 %.3f, held-out %s; %d steps in %.1f s" % (
        h1, rate, first, ", ".join("@%d %.3f" % e for e in evals), steps, dt)
    if abs(first - math.log(V)) > 0.5:
        raise Failure("first loss %.3f is not near ln V = %.3f: %s" % (first, math.log(V), det))
    if not final < 0.5 * h1:
        raise Failure("held-out loss %.3f not below 0.5 x unigram entropy (%.3f): %s" % (final, 0.5 * h1, det))
    if not final < rate + 0.4:     # it learned the transitions, not just the bigram marginals' shape
        raise Failure("held-out loss %.3f not within 0.4 nats of the entropy rate %.3f: %s" % (final, rate, det))
    return det


def blobs(rng, n, centers, spread):
    k = centers.shape[0]
    y = rng.integers(0, k, size=n)
    x = centers[y] + spread * rng.standard_normal((n, centers.shape[1]))
    return x.astype(np.float32), y.astype(np.int32)


def add_logits_output(text, B, C):
    """Makes sure the MLP returns %logits as "logits" (dlopt-run's evaluation
    then reports accuracy); dlopt-gen's classifiers already do."""
    if '{dlopt.output = "logits"}' in text:
        return text
    t = text.replace('-> (tensor<f32> {dlopt.output = "loss"})',
                     '-> (tensor<f32> {dlopt.output = "loss"}, tensor<%dx%dxf32> {dlopt.output = "logits"})' % (B, C))
    t = t.replace("return %loss : tensor<f32>", "return %%loss, %%logits : tensor<f32>, tensor<%dx%dxf32>" % (B, C))
    if t == text or "%logits =" not in t:
        raise Failure("cannot add a logits output to the generated MLP")
    return t


def mlp_forward(params, x, layers):
    h = x.astype(np.float64)
    for i in range(layers):
        h = np.maximum(h @ params["fc%d.weight" % i] + params["fc%d.bias" % i], 0.0)
    return h @ params["head.weight"] + params["head.bias"]


def mlp_blobs(ctx):
    D, C, B, H, L, steps = 8, 4, 32, 32, 2, 300
    while True:     # well-separated centers (pairwise distance >= 4, spread 1)
        centers = ctx.rng.standard_normal((C, D)) * 1.5
        dist = np.sqrt(((centers[:, None] - centers[None]) ** 2).sum(-1)) + 1e9 * np.eye(C)
        if dist.min() >= 4.0:
            break
    xtr, ytr = blobs(ctx.rng, 2048, centers, 1.0)
    xte, yte = blobs(ctx.rng, 512, centers, 1.0)
    # Bayes-optimal-ish sanity: nearest center on the held-out set
    nc = np.argmin(((xte[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)
    bayes = float(np.mean(nc == yte))
    for n, a in (("xtr", xtr), ("ytr", ytr), ("xte", xte), ("yte", yte)):
        np.save(ctx.path(n + ".npy"), a)
    r = ctx.tool("gen", ["mlp", "--in", str(D), "--hidden", str(H), "--layers", str(L), "--classes", str(C),
                         "--batch", str(B), "--activation", "relu", "-q"])
    with open(ctx.path("mlp.mlir"), "w") as f:
        f.write(add_logits_output(r.stdout, B, C))
    ctx.tool("compile", ["--train", "--optimizer", "adamw", "--lr", "1e-2", "--schedule", "cosine",
                         "--warmup-steps", "10", "--total-steps", str(steps), "--min-lr", "1e-3",
                         ctx.path("mlp.mlir"), "-o", ctx.path("mlp.plan"), "--quiet"])
    ctx.tool("run", [ctx.path("mlp.plan"), "--steps", str(steps),
                     "--data-input", "x=" + ctx.path("xtr.npy"), "--data-input", "labels=" + ctx.path("ytr.npy"),
                     "--eval-data-input", "x=" + ctx.path("xte.npy"),
                     "--eval-data-input", "labels=" + ctx.path("yte.npy"),
                     "--metrics", ctx.path("metrics.jsonl"), "--checkpoint-dir", ctx.path("ck"),
                     "--seed", str(ctx.seed % 1000), "--quiet"], timeout=600)
    m = read_jsonl(ctx.path("metrics.jsonl"))
    ev = [r for r in m if "eval_loss" in r]
    if not ev:
        raise Failure("no evaluation in the metrics")
    acc_dl = ev[-1].get("eval_accuracy")
    tensors, _ = read_safetensors(ctx.path("ck", "step-%06d.safetensors" % steps))
    P = {k: v.astype(np.float64) for k, v in tensors.items()}
    logits = mlp_forward(P, xte, L)
    acc_np = float(np.mean(np.argmax(logits, 1) == yte))
    det = "loss %.3f -> %.3f, held-out loss %.3f, accuracy %s (dlopt eval) / %.3f (NumPy from the checkpoint); " \
          "nearest-center %.3f" % (m[0]["loss"], m[-1]["loss"], ev[-1]["eval_loss"],
                                    "%.3f" % acc_dl if acc_dl is not None else "missing", acc_np, bayes)
    if acc_dl is None:
        raise Failure("dlopt-run reported no eval_accuracy: " + det)
    if acc_np <= 0.9 or acc_dl <= 0.9:
        raise Failure("accuracy not above 0.9: " + det)
    # dlopt's evaluation covers whole batches of the held-out set (512 = 16 x 32): same samples
    if abs(acc_dl - acc_np) > 0.01:
        raise Failure("dlopt's eval accuracy differs from the NumPy one: " + det)
    return det


def resume_gpt(ctx):
    N = 5
    toks, _ = markov_corpus(ctx.rng, 64, 8000)
    np.save(ctx.path("train.npy"), toks.astype(np.int32))
    ctx.tool("gen", ["gpt", "--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "16", "--vocab", "64",
                     "--batch", "4", "--dropout", "0.1", "-q", "-o", ctx.path("gpt.mlir")])
    ctx.tool("compile", ["--train", "--optimizer", "adamw", "--lr", "3e-3", "--schedule", "cosine",
                         "--warmup-steps", "2", "--total-steps", str(2 * N), "--clip-norm", "1.0",
                         ctx.path("gpt.mlir"), "-o", ctx.path("gpt.plan"), "--quiet"])
    common = ["--data", ctx.path("train.npy"), "--quiet"]
    seed = ["--seed", str(ctx.seed % 100000)]
    ctx.tool("run", [ctx.path("gpt.plan"), "--steps", str(2 * N), "--checkpoint-dir", ctx.path("A"),
                     "--metrics", ctx.path("A.jsonl")] + seed + common)
    ctx.tool("run", [ctx.path("gpt.plan"), "--steps", str(N), "--checkpoint-dir", ctx.path("B"),
                     "--metrics", ctx.path("B.jsonl")] + seed + common)
    ctx.tool("run", [ctx.path("gpt.plan"), "--steps", str(N), "--resume",
                     ctx.path("B", "step-%06d.safetensors" % N), "--checkpoint-dir", ctx.path("B"),
                     "--metrics", ctx.path("B.jsonl")] + common)
    a, b = read_jsonl(ctx.path("A.jsonl")), read_jsonl(ctx.path("B.jsonl"))
    sa = [r["step"] for r in a]
    sb = [r["step"] for r in b]
    if sa != list(range(1, 2 * N + 1)) or sb != sa:
        raise Failure("metrics steps: one run %s, resumed %s" % (sa, sb))
    for ra, rb in zip(a, b):
        for k in ("loss", "lr", "grad_norm"):
            if ra[k] != rb[k]:
                raise Failure("step %d %s: %r in one run, %r with resume" % (ra["step"], k, ra[k], rb[k]))
    fa = ctx.path("A", "step-%06d.safetensors" % (2 * N))
    fb = ctx.path("B", "step-%06d.safetensors" % (2 * N))
    ta, _ = read_safetensors(fa)
    tb, _ = read_safetensors(fb)
    if sorted(ta) != sorted(tb):
        raise Failure("checkpoint tensors differ: %s vs %s" % (sorted(ta), sorted(tb)))
    for k in ta:
        if ta[k].tobytes() != tb[k].tobytes():
            raise Failure("checkpoint tensor %s differs between the runs" % k)
    same_file = open(fa, "rb").read() == open(fb, "rb").read()
    if len(set(r["loss"] for r in a)) < 2 * N - 1:
        raise Failure("losses do not change between steps: %s" % [r["loss"] for r in a])
    return "%d+%d steps with --resume == %d steps: identical losses/lr/grad_norm and %d checkpoint tensors%s" % (
        N, N, 2 * N, len(ta), " (files byte-identical)" if same_file else " (file metadata differs)")


CASES = [("gpt.markov", gpt_markov), ("mlp.blobs", mlp_blobs), ("resume.gpt_dropout", resume_gpt)]


def run_case(name, fn, args, tools, work):
    return harness.run_ctx_case(Ctx(name, args.seed, tools, work), fn)


def main():
    return harness.main("check_training", __doc__, CASES, run_case, "dlopt-check-training-",
                        "models, data, metrics and checkpoints", tools=("gen", "compile", "run"))


if __name__ == "__main__":
    sys.exit(main())
