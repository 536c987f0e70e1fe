#!/usr/bin/env python3
"""End-to-end check of generated models against an independent NumPy model.

  gpt_reference.py --family gpt|llama|mlp [--preset NAME] [--dropout RATE]
                   [--activation relu|gelu|silu] [--work-dir DIR] [--seed N]
                   [--backend cpu]

Generates the model with dlopt-gen, compiles it with dlopt-compile and runs
it with dlopt-run on random tokens/labels (or features), saving the params it
used (--save-params). The loss is then recomputed in NumPy float64 from the
definition of the architecture (GPT-2, Llama 3, MLP; see docs/dlopt-gen.md
for the param names and [in, out] weight layout) using those params; the IR
is not read. Checks:

  * reference loss vs dlopt loss, |diff| <= 1e-4 * |ref|, with the params as
    initialized by dlopt-run and again with perturbed params bound through
    --input (non-trivial biases and norm weights, sharper attention);
  * determinism: the same --seed twice gives bitwise-identical loss and
    params; another seed gives different params and loss.

Prints one line per check and `N passed, M failed`; exits 1 on failure.
"""
import argparse
import math
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlopt_np import dropout_u, find_tool, run  # noqa: E402

REL_TOL = 1e-4

# Dims of the presets, from the tables of docs/dlopt-gen.md (the reference
# does not read the IR; the saved params' shapes are checked against these).
PRESETS = {
    "gpt-tiny": dict(family="gpt", layers=2, hidden=64, heads=4, kv_heads=4, ffn=256, seq=16,
                     vocab=128, batch=2, tied=True, eps=1e-5),
    "llama-tiny": dict(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn=192, seq=16,
                       vocab=128, batch=2, tied=False, eps=1e-5, theta=10000.0),
    "mlp-tiny": dict(family="mlp", inp=16, hidden=32, layers=2, classes=4, batch=4),
}
DEFAULT_PRESET = {"gpt": "gpt-tiny", "llama": "llama-tiny", "mlp": "mlp-tiny"}
DROPOUT_SEED = 42   # dlopt-gen's default --seed: first dropout op, then +1 each


# ----------------------------------------------------------- NumPy model

def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2)))


def silu(x):
    return x / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def causal_attention(q, k, v):
    """q [B,H,S,D], k/v [B,G,S,D]; query head h uses kv head h // (H/G)."""
    H, G, S, D = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    k = np.repeat(k, H // G, axis=1)
    v = np.repeat(v, H // G, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
    s = np.where(np.triu(np.ones((S, S), bool), 1), -np.inf, s)
    return softmax(s) @ v


def rope(x, theta):
    """Half-split rotary embedding over positions along dim -2."""
    S, D = x.shape[-2], x.shape[-1]
    h = D // 2
    a = np.arange(S)[:, None] * theta ** (-2.0 * np.arange(h) / D)[None, :]
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)


def cross_entropy(logits, labels, ignore=-100):
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    rows = labels != ignore
    if not rows.any():
        return 0.0
    idx = np.flatnonzero(rows)
    return float(np.mean(lse[idx] - logits[idx, labels[idx]]))


class Dropout:
    """The ops.md dropout; seeds in program order from DROPOUT_SEED."""

    def __init__(self, rate):
        self.rate, self.seed = rate, DROPOUT_SEED

    def __call__(self, x):
        if not self.rate:
            return x
        keep = (dropout_u(self.seed, x.size) >= self.rate).reshape(x.shape)
        self.seed += 1
        return np.where(keep, x / (1 - self.rate), 0.0)


def split_heads(t, B, S, n, d):
    return t.reshape(B, S, n, d).transpose(0, 2, 1, 3)


def merge_heads(t):
    B, H, S, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, S, H * d)


def gpt_loss(P, cfg, tokens, labels, rate):
    drop = Dropout(rate)
    B, S = tokens.shape
    h, H = cfg["hidden"], cfg["heads"]
    d = h // H
    eps = cfg["eps"]
    x = P["wte"][tokens] + P["wpe"][np.arange(S)][None]
    x = drop(x)
    for l in range(cfg["layers"]):
        p = lambda n: P["h%d.%s" % (l, n)]
        a = layer_norm(x, p("ln1.weight"), p("ln1.bias"), eps)
        q = split_heads(a @ p("attn.wq") + p("attn.bq"), B, S, H, d)
        k = split_heads(a @ p("attn.wk") + p("attn.bk"), B, S, H, d)
        v = split_heads(a @ p("attn.wv") + p("attn.bv"), B, S, H, d)
        o = merge_heads(causal_attention(q, k, v))
        x = x + drop(o @ p("attn.wo") + p("attn.bo"))
        m = layer_norm(x, p("ln2.weight"), p("ln2.bias"), eps)
        x = x + drop(gelu_tanh(m @ p("mlp.w1") + p("mlp.b1")) @ p("mlp.w2") + p("mlp.b2"))
    x = layer_norm(x, P["ln_f.weight"], P["ln_f.bias"], eps)
    logits = x @ P["wte"].T if cfg["tied"] else x @ P["lm_head"]
    return cross_entropy(logits.reshape(B * S, -1), labels.reshape(-1))


def llama_loss(P, cfg, tokens, labels, rate):
    assert not rate, "llama has no dropout"
    B, S = tokens.shape
    h, H, G = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    d = h // H
    eps, theta = cfg["eps"], cfg["theta"]
    x = P["wte"][tokens]
    for l in range(cfg["layers"]):
        p = lambda n: P["h%d.%s" % (l, n)]
        a = rms_norm(x, p("ln1.weight"), eps)
        q = rope(split_heads(a @ p("attn.wq"), B, S, H, d), theta)
        k = rope(split_heads(a @ p("attn.wk"), B, S, G, d), theta)
        v = split_heads(a @ p("attn.wv"), B, S, G, d)
        x = x + merge_heads(causal_attention(q, k, v)) @ p("attn.wo")
        m = rms_norm(x, p("ln2.weight"), eps)
        x = x + (silu(m @ p("mlp.w_gate")) * (m @ p("mlp.w_up"))) @ p("mlp.w_down")
    x = rms_norm(x, P["ln_f.weight"], eps)
    logits = x @ P["wte"].T if cfg["tied"] else x @ P["lm_head"]
    return cross_entropy(logits.reshape(B * S, -1), labels.reshape(-1))


ACT = {"relu": lambda x: np.maximum(x, 0), "gelu": gelu_erf, "silu": silu}


def mlp_loss(P, cfg, x, labels, rate, activation):
    drop = Dropout(rate)
    for i in range(cfg["layers"]):
        x = drop(ACT[activation](x @ P["fc%d.weight" % i] + P["fc%d.bias" % i]))
    return cross_entropy(x @ P["head.weight"] + P["head.bias"], labels)


def expected_shapes(cfg):
    f = cfg["family"]
    if f == "mlp":
        s = {}
        fan = cfg["inp"]
        for i in range(cfg["layers"]):
            s["fc%d.weight" % i] = (fan, cfg["hidden"])
            s["fc%d.bias" % i] = (cfg["hidden"],)
            fan = cfg["hidden"]
        s["head.weight"] = (fan, cfg["classes"])
        s["head.bias"] = (cfg["classes"],)
        return s
    h, V, d = cfg["hidden"], cfg["vocab"], cfg["hidden"] // cfg["heads"]
    kv = cfg["kv_heads"] * d
    s = {"wte": (V, h), "ln_f.weight": (h,)}
    for l in range(cfg["layers"]):
        p = "h%d." % l
        s[p + "ln1.weight"] = s[p + "ln2.weight"] = (h,)
        s[p + "attn.wq"] = (h, h)
        s[p + "attn.wk"] = s[p + "attn.wv"] = (h, kv)
        s[p + "attn.wo"] = (h, h)
        if f == "gpt":
            for n in ("ln1.bias", "ln2.bias", "attn.bq", "attn.bo", "mlp.b2"):
                s[p + n] = (h,)
            s[p + "attn.bk"] = s[p + "attn.bv"] = (kv,)
            s[p + "mlp.w1"], s[p + "mlp.b1"], s[p + "mlp.w2"] = (h, cfg["ffn"]), (cfg["ffn"],), (cfg["ffn"], h)
        else:
            s[p + "mlp.w_gate"] = s[p + "mlp.w_up"] = (h, cfg["ffn"])
            s[p + "mlp.w_down"] = (cfg["ffn"], h)
    if f == "gpt":
        s["wpe"] = (cfg["seq"], h)
        s["ln_f.bias"] = (h,)
    if not cfg["tied"]:
        s["lm_head"] = (h, V)
    return s


# ---------------------------------------------------------------- driver

class Checker:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, ok, name, detail):
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail))
        sys.stdout.flush()
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


def load_dir(d):
    return {f[:-4]: np.load(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".npy")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=sorted(DEFAULT_PRESET))
    ap.add_argument("--preset", help="a preset of PRESETS (default: FAMILY-tiny)")
    ap.add_argument("--dropout", type=float, default=0.0, help="dlopt-gen --dropout (gpt, mlp)")
    ap.add_argument("--activation", default="relu", choices=sorted(ACT), help="mlp activation")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--work-dir")
    ap.add_argument("--seed", type=int, help="data seed (default: random, printed)")
    ap.add_argument("--bin-dir")
    args = ap.parse_args()
    preset = args.preset or DEFAULT_PRESET[args.family]
    cfg = PRESETS[preset]
    assert cfg["family"] == args.family, "preset %s is not a %s" % (preset, args.family)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    gen, comp, runt = (find_tool(t, args.bin_dir) for t in ("dlopt-gen", "dlopt-compile", "dlopt-run"))
    own = args.work_dir is None
    work = tempfile.mkdtemp(prefix="dlopt-e2e-") if own else args.work_dir
    if os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work)
    desc = "%s --preset %s%s%s" % (args.family, preset,
                                   " --dropout %g" % args.dropout if args.dropout else "",
                                   " --activation %s" % args.activation if args.family == "mlp" else "")
    print("gpt_reference: %s, backend %s, seed %d (rerun with --seed %d), work dir %s" % (
        desc, args.backend, args.seed, args.seed, work))
    ck = Checker()
    rng = np.random.default_rng(args.seed)

    def path(*p):
        return os.path.join(work, *p)

    # 1. generate and compile
    cmd = [gen, args.family, "--preset", preset, "-q", "-o", path("m.mlir")]
    if args.dropout:
        cmd += ["--dropout", repr(args.dropout)]
    if args.family == "mlp":
        cmd += ["--activation", args.activation]
    r = run(cmd)
    if not ck.check(r.returncode == 0, "dlopt-gen", r.stderr.strip() or " ".join(cmd[1:])):
        return finish(ck, work, own)
    r = run([comp, path("m.mlir"), "-o", path("m.plan"), "--quiet"])
    if not ck.check(r.returncode == 0, "dlopt-compile", r.stderr.strip() or "ok"):
        return finish(ck, work, own)

    # 2. inputs: random tokens (or features) and labels, a few ignored (-100)
    B = cfg["batch"]
    if args.family == "mlp":
        data = rng.standard_normal((B, cfg["inp"])).astype(np.float32)
        labels = rng.integers(0, cfg["classes"], size=B).astype(np.int32)
        labels[rng.integers(0, B)] = -100
        inputs = {"x": data, "labels": labels}
    else:
        S, V = cfg["seq"], cfg["vocab"]
        data = rng.integers(0, V, size=(B, S)).astype(np.int32)
        labels = rng.integers(0, V, size=(B, S)).astype(np.int32)
        labels.ravel()[rng.choice(B * S, 3, replace=False)] = -100
        inputs = {"tokens": data, "labels": labels}
    for n, a in inputs.items():
        np.save(path(n + ".npy"), a)
    in_args = sum((["--input", "%s=%s" % (n, path(n + ".npy"))] for n in inputs), [])

    def dlopt_run(tag, seed, bind=None):
        cmd = [runt, path("m.plan"), "--backend", args.backend, "--quiet", "--seed", str(seed),
               "--output-dir", path(tag, "out"), "--save-params", path(tag, "params")] + in_args
        for n, f in (bind or {}).items():
            cmd += ["--input", "%s=%s" % (n, f)]
        r = run(cmd, timeout=600)
        if r.returncode != 0:
            ck.check(False, "dlopt-run " + tag, "rc %d: %s" % (r.returncode, r.stderr.strip()[:500]))
            return None, None
        return load_dir(path(tag, "params")), np.load(path(tag, "out", "loss.npy"))

    def reference(P):
        P = {k: v.astype(np.float64) for k, v in P.items()}
        if args.family == "gpt":
            return gpt_loss(P, cfg, data, labels, args.dropout)
        if args.family == "llama":
            return llama_loss(P, cfg, data, labels, args.dropout)
        return mlp_loss(P, cfg, data.astype(np.float64), labels, args.dropout, args.activation)

    def check_loss(name, P, loss):
        if loss.shape != () or loss.dtype != np.float32:
            return ck.check(False, name, "loss is %s %s, expected a f32 scalar" % (loss.dtype, loss.shape))
        ref = reference(P)
        got = float(loss)
        err = abs(got - ref)
        return ck.check(np.isfinite(got) and err <= REL_TOL * abs(ref), name,
                        "dlopt %.9g, numpy %.9g, rel err %.2e (tol %.0e)" % (
                            got, ref, err / abs(ref) if ref else err, REL_TOL))

    seed = rng.integers(0, 2 ** 31)
    P1, L1 = dlopt_run("run1", seed)
    if P1 is None:
        return finish(ck, work, own)

    # the params are the model's: names and shapes as documented
    exp = expected_shapes(cfg)
    got_shapes = {k: tuple(v.shape) for k, v in P1.items()}
    ck.check(got_shapes == exp, "param names and shapes",
             "%d params as in docs/dlopt-gen.md" % len(exp) if got_shapes == exp else
             "missing %s, unexpected %s, wrong shape %s" % (
                 sorted(set(exp) - set(got_shapes)), sorted(set(got_shapes) - set(exp)),
                 sorted(k for k in exp if k in got_shapes and got_shapes[k] != exp[k])))
    if got_shapes != exp:
        return finish(ck, work, own)

    # 3. loss with the initialized params
    check_loss("loss vs numpy (initialized params)", P1, L1)

    # 4. determinism
    P2, L2 = dlopt_run("run2", seed)
    if P2 is not None:
        same = L1.tobytes() == L2.tobytes() and all(P1[k].tobytes() == P2[k].tobytes() for k in P1)
        ck.check(same, "determinism (same seed)",
                 "bitwise identical loss and params" if same else
                 "loss %r vs %r; params differing: %s" % (float(L1), float(L2),
                                                          [k for k in P1 if P1[k].tobytes() != P2[k].tobytes()]))
    P3, L3 = dlopt_run("run3", seed + 1)
    if P3 is not None:
        # params with a random init must change; ones/zeros inits (norm weights, biases) cannot
        rand = [k for k in P1 if np.unique(P1[k]).size > 1]
        same = [k for k in rand if np.array_equal(P1[k], P3[k])]
        ok = bool(rand) and not same and L1.tobytes() != L3.tobytes()
        ck.check(ok, "different seed gives different params",
                 "%d randomly initialized params all differ, loss %.6g vs %.6g" % (len(rand), float(L1), float(L3))
                 if ok else "unchanged: %s, loss %r vs %r" % (same, float(L1), float(L3)))

    # 5. perturbed params bound with --input: non-zero biases, non-unit norm
    # weights and larger weights, so every term of the model matters
    os.makedirs(path("perturbed"))
    bind = {}
    Pp = {}
    for k, v in P1.items():
        if v.ndim == 1:
            new = (1.0 if k.endswith("weight") and args.family != "mlp" else 0.0) + 0.3 * rng.standard_normal(v.shape)
        elif k in ("wte", "wpe"):
            new = 0.4 * rng.standard_normal(v.shape)
        else:
            new = rng.standard_normal(v.shape) * 1.5 / math.sqrt(v.shape[0])
        Pp[k] = new.astype(np.float32)
        f = path("perturbed", k + ".npy")
        np.save(f, Pp[k])
        bind[k] = f
    P4, L4 = dlopt_run("run4", seed, bind)
    if P4 is not None:
        used = all(P4[k].tobytes() == Pp[k].tobytes() for k in Pp)
        ck.check(used, "bound params used as given", "ok" if used else "saved params differ from the bound ones")
        check_loss("loss vs numpy (perturbed params)", Pp, L4)
    return finish(ck, work, own)


def finish(ck, work, own):
    if own and not ck.failed:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (ck.passed, ck.failed))
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())
