#!/usr/bin/env python3
"""Op conformance suite: every op of docs/ops.md against NumPy (float64).

Each case builds a tiny MLIR module (inputs marked {dlopt.input = "NAME"}),
writes fresh random inputs, compiles it with dlopt-compile, runs it with
dlopt-run --backend BACKEND and compares every output with an independent
NumPy float64 reference (tolerances: dlopt_np.TOL). Error cases check that
dlopt-run exits non-zero with a message naming the op.

  check_ops.py [--backend cpu] [--work-dir DIR] [--seed N] [--filter REGEX]

Prints one line per case, then `N passed, M failed`; exits 1 on any failure.
The seed is printed; rerun with --seed N to reproduce a failure.
"""
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from dlopt_np import (FLOATS, INTS, as_ref, bf16_round, compare, dropout_u,  # noqa: E402
                      fmt_f, run, store, ttype as T)

class Case:
    def __init__(self, name, seed):
        self.name = name
        self.rng = harness.case_rng(seed, name)
        self.args = []      # (name, type, stored array)
        self.lines = []
        self.results = []   # (ssa, type, dtype, ref, mag, scale)
        self.error = None   # op name expected in the error message

    # -- inputs
    def data(self, shape, dt, gen="normal", lo=-1.0, hi=1.0, scale=1.0):
        r = self.rng
        if dt == "i1":
            v = r.random(shape) < 0.5
            if v.size >= 2:
                v.ravel()[0], v.ravel()[1] = True, False
            return v
        if dt in INTS:
            return r.integers(int(lo), int(hi), size=shape)
        if gen == "normal":
            return r.standard_normal(shape) * scale
        if gen == "uniform":
            return r.uniform(lo, hi, size=shape)
        raise ValueError(gen)

    def inp(self, name, shape, dt, data=None, **kw):
        if data is None:
            data = self.data(tuple(shape), dt, **kw)
        stored = store(data, dt)
        assert stored.shape == tuple(shape), (name, stored.shape, shape)
        self.args.append((name, T(shape, dt), stored))
        return as_ref(stored, dt)

    def op(self, line):
        self.lines.append(line)

    def out(self, ssa, shape, dt, ref, mag=None, scale=1.0):
        self.results.append((ssa, T(shape, dt), dt, np.asarray(ref), mag, scale))

    def expect_error(self, opname, ssa, shape, dt):
        self.error = opname
        self.results.append((ssa, T(shape, dt), dt, None, None, 1.0))

    def mlir(self):
        args = ",\n    ".join('%%%s: %s {dlopt.input = "%s"}' % (n, t, n)
                              for n, t, _ in self.args)
        rtypes = ", ".join(t for _, t, *_ in self.results)
        body = "\n".join("  " + l for l in self.lines)
        rets = ", ".join(s for s, *_ in self.results)
        return ("func.func @main(%s) -> (%s) {\n%s\n  return %s : %s\n}\n"
                % (args, rtypes, body, rets, rtypes))


CASES = []


def case(name):
    def deco(fn):
        CASES.append((name, fn))
        return fn
    return deco


def add(name, fn, *a, **kw):
    CASES.append((name, lambda c: fn(c, *a, **kw)))


# ------------------------------------------------------------ references

def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


UNARY = {
    "neg": (lambda x: -x, {}),
    "abs": (np.abs, {}),
    "relu": (lambda x: np.maximum(x, 0), {}),
    "exp": (np.exp, dict(scale=2.0)),
    "log": (np.log, dict(gen="uniform", lo=0.05, hi=5.0)),
    "sqrt": (np.sqrt, dict(gen="uniform", lo=0.0, hi=5.0)),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), dict(gen="uniform", lo=0.05, hi=5.0)),
    "tanh": (np.tanh, dict(scale=2.0)),
    "sin": (np.sin, dict(scale=3.0)),
    "cos": (np.cos, dict(scale=3.0)),
    "sigmoid": (sigmoid, dict(scale=3.0)),
    "silu": (lambda x: x * sigmoid(x), dict(scale=3.0)),
    "gelu": (lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), dict(scale=3.0)),
    "gelu_tanh": (lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
                  dict(scale=3.0)),
}


def unary(c, op, dt, shape=(4, 8)):
    fn, kw = UNARY[op]
    x = c.inp("x", shape, dt, **kw)
    attr = ' {approximate = "tanh"}' if op == "gelu_tanh" else ""
    mn = "gelu" if op == "gelu_tanh" else op
    c.op("%%y = dlopt.%s %%x%s : %s" % (mn, attr, T(shape, dt)))
    c.out("%y", shape, dt, fn(x))


for _dt in FLOATS:
    for _op in UNARY:
        add("%s.%s" % (_op, _dt), unary, _op, _dt, shape=(4, 8) if _dt == "f32" else (3, 5))
for _dt in INTS:
    for _op, _fn in (("neg", lambda x: -x), ("abs", np.abs), ("relu", lambda x: np.maximum(x, 0))):
        def _int_unary(c, op=_op, fn=_fn, dt=_dt):
            x = c.inp("x", (4, 8), dt, lo=-1000, hi=1000)
            c.op("%%y = dlopt.%s %%x : %s" % (op, T((4, 8), dt)))
            c.out("%y", (4, 8), dt, fn(x))
        add("%s.%s" % (_op, _dt), _int_unary)


@case("gelu.f32.default_attr_explicit")
def _(c):
    x = c.inp("x", (16,), "f32", scale=3.0)
    c.op('%y = dlopt.gelu %x {approximate = "none"} : tensor<16xf32>')
    c.out("%y", (16,), "f32", UNARY["gelu"][0](x))


# ------------------------------------------------------------------ cast

def cast_ref(x, src, dst):
    """x: exact source values (float64 / int64 / bool)."""
    if dst == "i1":
        return x != 0
    if src == "i1":
        x = x.astype(np.int64)
    if dst in INTS:
        if src in INTS or src == "i1":
            return x.astype(np.int64)
        info = np.iinfo(np.int32 if dst == "i32" else np.int64)
        t = np.trunc(np.nan_to_num(x, nan=0.0, posinf=np.inf, neginf=-np.inf))
        out = np.empty(x.shape, np.int64)
        flat, tf = out.ravel(), t.ravel()
        for i, v in enumerate(tf):
            flat[i] = info.max if v >= info.max else info.min if v <= info.min else int(v)
        return out.reshape(x.shape)
    # float destination: exact value rounded once (via float32 when exact)
    xf = np.asarray(x, np.float64)
    if dst == "f32":
        return xf.astype(np.float32).astype(np.float64)
    if dst == "f16":
        return xf.astype(np.float16).astype(np.float64)
    return bf16_round(xf.astype(np.float32)).astype(np.float64)


CAST_SPECIAL = {
    # truncation toward zero, saturation, NaN -> 0, +-inf, -0
    "f32": [1.5, -1.5, 2.99, -2.99, 3e9, -3e9, 1e19, -1e19, np.nan, np.inf, -np.inf, -0.0, 0.0,
            # bf16 ties: 1+2^-8 (to 1), 1+3*2^-8 (to 1+2^-6), f16 tie 1+2^-11
            1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 1e-5, 65504.0],
}


def cast_case(c, src, dst):
    n = 48
    if src in FLOATS:
        base = c.rng.standard_normal(n) * 50
        if src == "f32":
            sp = [v for v in CAST_SPECIAL["f32"]
                  if not (dst in ("f16",) and abs(v) > 65504 and np.isfinite(v))]
            base[:len(sp)] = sp
        elif src == "f16":
            base[:6] = [1.5, -1.5, -2.75, 0.0, 1 + 2 ** -10, 1e-5]
        else:
            base[:5] = [1.5, -2.5, 0.0, 3e9, -1e19] if dst in INTS else [1.5, -2.5, 0.0, 1 + 2 ** -7, 100.5]
        data = base
    elif src in INTS:
        lim = 60000 if dst == "f16" else 1 << 20    # f16: stay in range
        data = c.rng.integers(-lim, lim, size=n)
        data[:6] = [0, 0, 257, 259, -257, lim]   # 257 -> 256, 259 -> 260 in bf16
        if dst == "i1":
            data[6:12] = 0
    else:
        data = c.data((n,), "i1")
    x = c.inp("x", (n,), src, data=data)
    c.op("%%y = dlopt.cast %%x : %s -> %s" % (T((n,), src), T((n,), dst)))
    c.out("%y", (n,), dst, cast_ref(x, src, dst), scale=0.0 if dst in FLOATS else 1.0)


for _s, _d in [("f32", "bf16"), ("bf16", "f32"), ("f32", "f16"), ("f16", "f32"), ("f16", "bf16"),
               ("bf16", "f16"), ("f32", "i32"), ("f32", "i64"), ("bf16", "i32"), ("f16", "i64"),
               ("i32", "f32"), ("i32", "bf16"), ("i64", "f16"), ("i32", "i64"), ("i64", "i32"),
               ("f32", "i1"), ("i32", "i1"), ("i1", "f32"), ("i1", "i32"), ("i1", "bf16"),
               ("f32", "f32")]:
    add("cast.%s_to_%s" % (_s, _d), cast_case, _s, _d)


# ---------------------------------------------------------------- binary

BIN = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
}


def binary(c, op, dt, sa, sb):
    so = np.broadcast_shapes(sa, sb)
    if op == "pow":
        a = c.inp("a", sa, dt, gen="uniform", lo=0.2, hi=3.0)
        b = c.inp("b", sb, dt, gen="uniform", lo=-2.0, hi=2.0)
    elif op == "div":
        a = c.inp("a", sa, dt, scale=2.0)
        bb = c.rng.uniform(0.25, 2.0, size=sb) * np.where(c.rng.random(sb) < 0.5, -1, 1)
        b = c.inp("b", sb, dt, data=bb)
    else:
        a = c.inp("a", sa, dt, scale=2.0)
        b = c.inp("b", sb, dt, scale=2.0)
    c.op("%%z = dlopt.%s %%a, %%b : %s, %s -> %s" % (op, T(sa, dt), T(sb, dt), T(so, dt)))
    c.out("%z", so, dt, BIN[op](a, b))


for _op in BIN:
    add("%s.f32" % _op, binary, _op, "f32", (4, 8), (8,))
    add("%s.f32.bcast2" % _op, binary, _op, "f32", (3, 1), (2, 1, 8))
    add("%s.bf16" % _op, binary, _op, "bf16", (3, 5), (3, 5))
    add("%s.f16" % _op, binary, _op, "f16", (5,), (3, 5))


def nan_prop(c, op):
    a = c.data((12,), "f32")
    b = c.data((12,), "f32")
    a[[1, 5]] = np.nan
    b[[5, 7]] = np.nan
    a = c.inp("a", (12,), "f32", data=a)
    b = c.inp("b", (12,), "f32", data=b)
    c.op("%%z = dlopt.%s %%a, %%b : tensor<12xf32>, tensor<12xf32> -> tensor<12xf32>" % op)
    c.out("%z", (12,), "f32", BIN[op](a, b))   # np.maximum/minimum propagate NaN


add("maximum.f32.nan", nan_prop, "maximum")
add("minimum.f32.nan", nan_prop, "minimum")


def int_wrap(v, dt):
    return v.astype(np.int32).astype(np.int64) if dt == "i32" else v


def int_binary(c, op, dt, sa, sb, big=False):
    so = np.broadcast_shapes(sa, sb)
    lim = (1 << 30) if big else 1000
    a = c.inp("a", sa, dt, lo=-lim, hi=lim)
    if op == "div":
        bb = c.rng.integers(1, 40, size=sb) * np.where(c.rng.random(sb) < 0.5, -1, 1)
        b = c.inp("b", sb, dt, data=bb)
    else:
        b = c.inp("b", sb, dt, lo=-lim, hi=lim)
    c.op("%%z = dlopt.%s %%a, %%b : %s, %s -> %s" % (op, T(sa, dt), T(sb, dt), T(so, dt)))
    if op == "div":
        q = np.abs(a) // np.abs(b) * np.sign(a) * np.sign(b)    # truncation toward zero
        ref = q
    elif op == "mul" and dt == "i64" and big:
        ref = (a.astype(object) * b.astype(object))
        ref = np.vectorize(lambda v: ((v + (1 << 63)) % (1 << 64)) - (1 << 63), otypes=[np.int64])(ref)
    else:
        ref = BIN[op](a, b)
    c.out("%z", so, dt, int_wrap(ref, dt))


for _dt in INTS:
    for _op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        add("%s.%s" % (_op, _dt), int_binary, _op, _dt, (4, 8), (8,))
    add("add.%s.wrap" % _dt, int_binary, "add", _dt, (4, 1), (1, 6), big=True)
    add("mul.%s.wrap" % _dt, int_binary, "mul", _dt, (16,), (16,), big=True)


@case("div.i32.negative_trunc")
def _(c):
    c.inp("a", (8,), "i32", data=[7, -7, 7, -7, 1, -1, 0, 13])
    c.inp("b", (8,), "i32", data=[2, 2, -2, -2, 3, 3, -5, -13])
    c.op("%z = dlopt.div %a, %b : tensor<8xi32>, tensor<8xi32> -> tensor<8xi32>")
    c.out("%z", (8,), "i32", np.array([3, -3, -3, 3, 0, 0, 0, -1]))


PRED = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
        "gt": np.greater, "ge": np.greater_equal}


def compare_case(c, pred, dt):
    sa, sb = (4, 8), (8,)
    if dt in INTS:
        a = c.inp("a", sa, dt, lo=-3, hi=3)
        b = c.inp("b", sb, dt, lo=-3, hi=3)
    else:
        av = c.data(sa, dt)
        bv = c.data(sb, dt)
        av[0] = bv          # equal elements, so eq/le/ge matter
        a = c.inp("a", sa, dt, data=av)
        b = c.inp("b", sb, dt, data=bv)
    c.op("%%c = dlopt.compare %s, %%a, %%b : %s, %s -> %s" % (pred, T(sa, dt), T(sb, dt), T(sa, "i1")))
    c.out("%c", sa, "i1", PRED[pred](a, b))


for _p in PRED:
    add("compare.%s.f32" % _p, compare_case, _p, "f32")
    add("compare.%s.i32" % _p, compare_case, _p, "i32")
add("compare.lt.bf16", compare_case, "lt", "bf16")
add("compare.eq.i64", compare_case, "eq", "i64")


@case("compare.f32.nan")
def _(c):
    av = np.array([1.0, np.nan, 2.0, np.nan])
    bv = np.array([np.nan, 1.0, 2.0, np.nan])
    a = c.inp("a", (4,), "f32", data=av)
    b = c.inp("b", (4,), "f32", data=bv)
    for p in PRED:
        c.op("%%%s = dlopt.compare %s, %%a, %%b : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>" % (p, p))
        c.out("%" + p, (4,), "i1", PRED[p](a, b))


def select_case(c, dt, sc, sa, sb):
    so = np.broadcast_shapes(sc, sa, sb)
    cond = c.inp("c", sc, "i1")
    a = c.inp("a", sa, dt, lo=-100, hi=100)
    b = c.inp("b", sb, dt, lo=-100, hi=100)
    c.op("%%r = dlopt.select %%c, %%a, %%b : %s, %s, %s -> %s" % (T(sc, "i1"), T(sa, dt), T(sb, dt), T(so, dt)))
    c.out("%r", so, dt, np.where(cond, a, b))


add("select.f32", select_case, "f32", (4, 8), (4, 8), (4, 8))
add("select.f32.bcast", select_case, "f32", (4, 1), (4, 8), (8,))
add("select.i32.bcast", select_case, "i32", (8,), (3, 1), (3, 8))
add("select.bf16", select_case, "bf16", (2, 3, 4), (3, 4), (2, 1, 4))


# ------------------------------------------------------------ reductions

def reduce_case(c, op, dt, shape, dims, keepdims=False, gen="normal"):
    if dt in INTS:
        x = c.inp("x", shape, dt, lo=-1000, hi=1000)
    else:
        x = c.inp("x", shape, dt)
    nd = len(shape)
    axes = tuple(sorted(d % nd for d in dims))
    oshape = tuple(1 if i in axes else s for i, s in enumerate(shape)) if keepdims else \
        tuple(s for i, s in enumerate(shape) if i not in axes)
    kd = " keepdims" if keepdims else ""
    c.op("%%y = dlopt.%s %%x dims = [%s]%s : %s -> %s" % (
        op, ", ".join(map(str, dims)), kd, T(shape, dt), T(oshape, dt)))
    if op == "sum":
        ref = x.sum(axis=axes, keepdims=keepdims) if axes else x
        mag = np.abs(x).sum(axis=axes, keepdims=keepdims) if axes and dt in FLOATS else None
    elif op == "mean":
        ref = x.mean(axis=axes, keepdims=keepdims) if axes else x
        mag = np.abs(x).mean(axis=axes, keepdims=keepdims) if axes else None
    else:
        ref = x.max(axis=axes, keepdims=keepdims) if axes else x
        mag = None
    c.out("%y", oshape, dt, ref, mag=mag)


add("sum.f32.keepdims", reduce_case, "sum", "f32", (2, 3, 4), [1, 2], True)
add("sum.f32.negdims", reduce_case, "sum", "f32", (2, 3, 4), [0, -1])
add("sum.f32.nodims", reduce_case, "sum", "f32", (2, 3, 4), [])
add("sum.f32.all", reduce_case, "sum", "f32", (3, 5, 7), [0, 1, 2])
add("sum.f32.all.keepdims", reduce_case, "sum", "f32", (3, 5, 7), [0, 1, 2], True)
add("sum.f32.long", reduce_case, "sum", "f32", (4, 8192), [1])
add("sum.f32.dim0.long", reduce_case, "sum", "f32", (4096, 3), [0])
add("sum.f32.middle", reduce_case, "sum", "f32", (3, 17, 5), [1])
add("sum.bf16", reduce_case, "sum", "bf16", (8, 256), [1])
add("sum.f16", reduce_case, "sum", "f16", (4, 300), [-1], True)
add("mean.f32.negdims", reduce_case, "mean", "f32", (2, 3, 4), [0, -1])
add("mean.f32.keepdims", reduce_case, "mean", "f32", (5, 6, 7), [1], True)
add("mean.f32.long", reduce_case, "mean", "f32", (2, 10000), [1])
add("mean.bf16", reduce_case, "mean", "bf16", (6, 64), [1])
add("mean.f16", reduce_case, "mean", "f16", (3, 4, 50), [0, 2])
add("max.f32", reduce_case, "max", "f32", (5, 6), [1])
add("max.f32.multi.keepdims", reduce_case, "max", "f32", (3, 4, 5), [0, 2], True)
add("max.f32.negdims", reduce_case, "max", "f32", (3, 4, 5), [-2])
add("max.bf16", reduce_case, "max", "bf16", (4, 9), [0])
add("max.f16", reduce_case, "max", "f16", (4, 9), [1])
for _dt in INTS:
    add("sum.%s" % _dt, reduce_case, "sum", _dt, (5, 6), [1])
    add("sum.%s.all.keepdims" % _dt, reduce_case, "sum", _dt, (3, 4, 5), [0, 1, 2], True)
    add("max.%s" % _dt, reduce_case, "max", _dt, (5, 6), [0])
    add("max.%s.negdims" % _dt, reduce_case, "max", _dt, (3, 4, 5), [-1, -3], True)


@case("max.f32.all_negative")
def _(c):
    x = c.inp("x", (4, 6), "f32", gen="uniform", lo=-10.0, hi=-1.0)
    c.op("%y = dlopt.max %x dims = [1] : tensor<4x6xf32> -> tensor<4xf32>")
    c.out("%y", (4,), "f32", x.max(axis=1))


# ---------------------------------------------------------------- matmul

def mm_ref(a, b, ta, tb):
    if ta:
        a = np.swapaxes(a, -1, -2)
    if tb:
        b = np.swapaxes(b, -1, -2)
    return a @ b, np.abs(a) @ np.abs(b)


def matmul_case(c, dt, sa, sb, ta=False, tb=False):
    a = c.inp("a", sa, dt)
    b = c.inp("b", sb, dt)
    ref, mag = mm_ref(a, b, ta, tb)
    attrs = [n for n, f in (("transpose_a", ta), ("transpose_b", tb)) if f]
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    c.op("%%c = dlopt.matmul %%a, %%b%s : %s, %s -> %s" % (at, T(sa, dt), T(sb, dt), T(ref.shape, dt)))
    c.out("%c", ref.shape, dt, ref, mag=mag)


add("matmul.f32", matmul_case, "f32", (5, 7), (7, 6))
add("matmul.f32.ta", matmul_case, "f32", (7, 5), (7, 6), ta=True)
add("matmul.f32.tb", matmul_case, "f32", (5, 7), (6, 7), tb=True)
add("matmul.f32.ta_tb", matmul_case, "f32", (7, 5), (6, 7), ta=True, tb=True)
add("matmul.f32.batch_rank2_b", matmul_case, "f32", (2, 4, 8), (16, 8), tb=True)
add("matmul.f32.batch_rank2_a", matmul_case, "f32", (8, 16), (2, 16, 4))
add("matmul.f32.batch_bcast", matmul_case, "f32", (3, 1, 8, 4), (5, 8, 6), ta=True)
add("matmul.f32.batch_bcast2", matmul_case, "f32", (2, 1, 3, 5), (1, 4, 5, 2))
add("matmul.f32.batch_tb", matmul_case, "f32", (2, 3, 9, 10), (2, 3, 11, 10), tb=True)
add("matmul.f32.longK", matmul_case, "f32", (16, 1024), (1024, 24))
add("matmul.f32.big", matmul_case, "f32", (67, 129), (129, 65))
add("matmul.f32.vec", matmul_case, "f32", (1, 33), (33, 1))
add("matmul.bf16", matmul_case, "bf16", (2, 4, 32), (32, 16))
add("matmul.bf16.tb", matmul_case, "bf16", (2, 4, 32), (16, 32), tb=True)
add("matmul.f16", matmul_case, "f16", (2, 4, 32), (32, 16))
add("matmul.f16.ta_batch", matmul_case, "f16", (3, 32, 5), (3, 32, 6), ta=True)


# ------------------------------------------------------------- shape ops

@case("reshape.f32")
def _(c):
    x = c.inp("x", (4, 8), "f32")
    c.op("%y = dlopt.reshape %x : tensor<4x8xf32> -> tensor<2x16xf32>")
    c.op("%z = dlopt.reshape %x : tensor<4x8xf32> -> tensor<32xf32>")
    c.op("%w = dlopt.reshape %x : tensor<4x8xf32> -> tensor<2x2x1x8xf32>")
    c.out("%y", (2, 16), "f32", x.reshape(2, 16))
    c.out("%z", (32,), "f32", x.reshape(32))
    c.out("%w", (2, 2, 1, 8), "f32", x.reshape(2, 2, 1, 8))


@case("reshape.i1_i64_scalar")
def _(c):
    m = c.inp("m", (2, 6), "i1")
    i = c.inp("i", (3, 4), "i64", lo=-50, hi=50)
    s = c.inp("s", (1, 1), "f32")
    c.op("%a = dlopt.reshape %m : tensor<2x6xi1> -> tensor<3x4xi1>")
    c.op("%b = dlopt.reshape %i : tensor<3x4xi64> -> tensor<12xi64>")
    c.op("%d = dlopt.reshape %s : tensor<1x1xf32> -> tensor<f32>")
    c.out("%a", (3, 4), "i1", m.reshape(3, 4))
    c.out("%b", (12,), "i64", i.reshape(12))
    c.out("%d", (), "f32", s.reshape(()))


def transpose_case(c, dt, shape, perm):
    x = c.inp("x", shape, dt, lo=-100, hi=100)
    ref = np.transpose(x, perm)
    c.op("%%y = dlopt.transpose %%x perm = [%s] : %s -> %s" % (
        ", ".join(map(str, perm)), T(shape, dt), T(ref.shape, dt)))
    c.out("%y", ref.shape, dt, ref, scale=0.0)


add("transpose.f32.2d", transpose_case, "f32", (4, 8), (1, 0))
add("transpose.f32.3d", transpose_case, "f32", (2, 3, 4), (2, 0, 1))
add("transpose.f32.4d", transpose_case, "f32", (2, 5, 3, 4), (0, 2, 1, 3))
add("transpose.f32.4d_rev", transpose_case, "f32", (2, 5, 3, 4), (3, 2, 1, 0))
add("transpose.i64", transpose_case, "i64", (3, 7), (1, 0))
add("transpose.bf16", transpose_case, "bf16", (3, 2, 5), (1, 2, 0))


def bcast_case(c, dt, shape, oshape):
    x = c.inp("x", shape, dt, lo=-100, hi=100)
    c.op("%%y = dlopt.broadcast_to %%x : %s -> %s" % (T(shape, dt), T(oshape, dt)))
    c.out("%y", oshape, dt, np.broadcast_to(x, oshape), scale=0.0)


add("broadcast_to.f32.lead", bcast_case, "f32", (1, 8), (3, 4, 8))
add("broadcast_to.f32.col", bcast_case, "f32", (4, 1), (4, 5))
add("broadcast_to.f32.mid", bcast_case, "f32", (3, 1, 2), (2, 3, 4, 2))
add("broadcast_to.f32.scalar", bcast_case, "f32", (), (2, 3))
add("broadcast_to.i32", bcast_case, "i32", (8,), (2, 8))
add("broadcast_to.i1", bcast_case, "i1", (1, 4), (3, 4))


def concat_case(c, dt, shapes, dim):
    xs = [c.inp("x%d" % i, s, dt, lo=-100, hi=100) for i, s in enumerate(shapes)]
    ref = np.concatenate(xs, axis=dim)
    c.op("%%y = dlopt.concat %s dim = %d : %s -> %s" % (
        ", ".join("%%x%d" % i for i in range(len(xs))), dim,
        ", ".join(T(s, dt) for s in shapes), T(ref.shape, dt)))
    c.out("%y", ref.shape, dt, ref, scale=0.0)


add("concat.f32.dim0", concat_case, "f32", [(2, 8), (3, 8)], 0)
add("concat.f32.dim1.three", concat_case, "f32", [(2, 3, 4), (2, 1, 4), (2, 5, 4)], 1)
add("concat.f32.last", concat_case, "f32", [(2, 3, 4), (2, 3, 2)], 2)
add("concat.f32.single", concat_case, "f32", [(2, 3)], 0)
add("concat.i32", concat_case, "i32", [(4, 2), (4, 3)], 1)
add("concat.bf16", concat_case, "bf16", [(1, 5), (2, 5)], 0)


def slice_case(c, dt, shape, start, limit, stride):
    x = c.inp("x", shape, dt, lo=-100, hi=100)
    ref = x[tuple(slice(a, b, s) for a, b, s in zip(start, limit, stride))]
    j = lambda v: ", ".join(map(str, v))
    c.op("%%y = dlopt.slice %%x start = [%s] limit = [%s] stride = [%s] : %s -> %s" % (
        j(start), j(limit), j(stride), T(shape, dt), T(ref.shape, dt)))
    c.out("%y", ref.shape, dt, ref, scale=0.0)


add("slice.f32", slice_case, "f32", (4, 8), [0, 1], [4, 8], [1, 2])
add("slice.f32.strides", slice_case, "f32", (5, 8, 9), [1, 0, 2], [5, 7, 9], [2, 3, 4])
add("slice.f32.unit", slice_case, "f32", (6, 7), [2, 3], [3, 7], [1, 1])
add("slice.f32.empty_ok_range", slice_case, "f32", (6, 7), [0, 0], [6, 7], [5, 6])
add("slice.i64", slice_case, "i64", (10,), [1], [10], [3])


def gather_case(c, dt, tshape, ishape, idt):
    t = c.inp("t", tshape, dt, lo=-100, hi=100)
    ids = c.inp("ids", ishape, idt, lo=0, hi=tshape[0])
    ref = t[ids]
    c.op("%%y = dlopt.gather %%t, %%ids : %s, %s -> %s" % (T(tshape, dt), T(ishape, idt), T(ref.shape, dt)))
    c.out("%y", ref.shape, dt, ref, scale=0.0)


add("gather.f32.i32", gather_case, "f32", (10, 4), (2, 5), "i32")
add("gather.f32.i64", gather_case, "f32", (10, 4), (7,), "i64")
add("gather.f32.3d_table", gather_case, "f32", (6, 2, 3), (4,), "i32")
add("gather.f32.1d_table", gather_case, "f32", (9,), (2, 3), "i32")
add("gather.f16", gather_case, "f16", (100, 16), (2, 5), "i64")
add("gather.i32", gather_case, "i32", (8, 3), (3, 2), "i32")


def iota_case(c, dt, shape, dim):
    c.inp("dummy", (1,), "f32")   # every case gets at least one input
    c.op("%%y = dlopt.iota dim = %d : %s" % (dim, T(shape, dt)))
    ref = as_ref(store(np.indices(shape)[dim], dt), dt)   # bf16: 257 rounds to 256
    c.out("%y", shape, dt, ref, scale=0.0)


add("iota.i32.dim1", iota_case, "i32", (3, 16), 1)
add("iota.i32.dim0", iota_case, "i32", (16,), 0)
add("iota.i64.dim0", iota_case, "i64", (4, 3, 2), 0)
add("iota.f32.dim1", iota_case, "f32", (4, 5), 1)
add("iota.bf16", iota_case, "bf16", (300,), 0)


# ---------------------------------------------------------------- NN ops

def softmax_case(c, op, dt, shape, dim, scale=1.0):
    x = c.inp("x", shape, dt, scale=scale)
    c.op("%%y = dlopt.%s %%x dim = %d : %s" % (op, dim, T(shape, dt)))
    ax = dim % len(shape)
    if op == "softmax":
        c.out("%y", shape, dt, softmax(x, ax))
    else:
        c.out("%y", shape, dt, log_softmax(x, ax), mag=np.abs(x).max(axis=ax, keepdims=True) + np.abs(log_softmax(x, ax)))


add("softmax.f32.last", softmax_case, "softmax", "f32", (2, 4, 8), 2)
add("softmax.f32.mid", softmax_case, "softmax", "f32", (2, 4, 8), 1)
add("softmax.f32.dim0", softmax_case, "softmax", "f32", (5, 3), 0)
add("softmax.f32.negdim", softmax_case, "softmax", "f32", (3, 7), -1)
add("softmax.f32.large", softmax_case, "softmax", "f32", (4, 64), 1, scale=40.0)
add("softmax.f32.long", softmax_case, "softmax", "f32", (2, 5000), 1)
add("softmax.bf16", softmax_case, "softmax", "bf16", (3, 16), 1)
add("softmax.f16", softmax_case, "softmax", "f16", (3, 16), 1, scale=5.0)
add("log_softmax.f32.last", softmax_case, "log_softmax", "f32", (2, 4, 8), -1)
add("log_softmax.f32.dim0", softmax_case, "log_softmax", "f32", (6, 5), 0)
add("log_softmax.f32.large", softmax_case, "log_softmax", "f32", (4, 32), 1, scale=50.0)
add("log_softmax.bf16", softmax_case, "log_softmax", "bf16", (3, 16), 1)
add("log_softmax.f16", softmax_case, "log_softmax", "f16", (3, 16), 1)


def layer_norm_case(c, dt, shape, axis=None, w=True, b=True, eps=None, rms=False):
    nd = len(shape)
    ax = nd - 1 if axis is None else axis % nd
    # an offset (layer_norm) exercises the variance computation
    x = c.inp("x", shape, dt, data=c.data(tuple(shape), dt, scale=3.0) + (0.0 if rms else 5.0))
    ns = tuple(shape[ax:])
    operands, types, attrs = ["%x"], [T(shape, dt)], []
    wv = bv = None
    if w:
        wv = c.inp("w", ns, dt, gen="uniform", lo=0.5, hi=1.5)
        operands.append("weight(%w)")
        types.append(T(ns, dt))
    if b and not rms:
        bv = c.inp("b", ns, dt)
        operands.append("bias(%b)")
        types.append(T(ns, dt))
    if axis is not None:
        attrs.append("axis = %d" % axis)
    if eps is not None:
        attrs.append("eps = %s" % fmt_f(eps))
    e = (1e-6 if rms else 1e-5) if eps is None else eps
    red = tuple(range(ax, nd))
    if rms:
        n = x / np.sqrt((x * x).mean(axis=red, keepdims=True) + e)
    else:
        mu = x.mean(axis=red, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=red, keepdims=True)
        n = (x - mu) / np.sqrt(var + e)
    y, mag = n, np.abs(n)
    if wv is not None:
        y, mag = y * wv, mag * np.abs(wv)
    if bv is not None:
        y, mag = y + bv, mag + np.abs(bv)
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    opn = "rms_norm" if rms else "layer_norm"
    c.op("%%y = dlopt.%s %s%s : (%s) -> %s" % (opn, " ".join(operands), at, ", ".join(types), T(shape, dt)))
    c.out("%y", shape, dt, y, mag=mag)


add("layer_norm.f32.wb", layer_norm_case, "f32", (2, 4, 8))
add("layer_norm.f32.none", layer_norm_case, "f32", (3, 16), w=False, b=False)
add("layer_norm.f32.bias_only.axis", layer_norm_case, "f32", (2, 4, 8), axis=2, w=False)
add("layer_norm.f32.weight_only", layer_norm_case, "f32", (5, 12), b=False)
add("layer_norm.f32.axis1", layer_norm_case, "f32", (2, 4, 8), axis=1, eps=1e-3)
add("layer_norm.f32.axis_neg2", layer_norm_case, "f32", (3, 2, 5, 6), axis=-2)
add("layer_norm.f32.long", layer_norm_case, "f32", (2, 4096))
add("layer_norm.bf16", layer_norm_case, "bf16", (2, 3, 32))
add("layer_norm.f16", layer_norm_case, "f16", (4, 32))
add("rms_norm.f32.w", layer_norm_case, "f32", (2, 4, 8), rms=True)
add("rms_norm.f32.now", layer_norm_case, "f32", (3, 16), w=False, rms=True)
add("rms_norm.f32.axis1.eps", layer_norm_case, "f32", (2, 4, 8), axis=1, eps=1e-2, rms=True)
add("rms_norm.f32.explicit_eps", layer_norm_case, "f32", (2, 4, 8), axis=2, eps=1e-5, rms=True)
add("rms_norm.bf16", layer_norm_case, "bf16", (2, 64), rms=True)
add("rms_norm.f16", layer_norm_case, "f16", (2, 64), rms=True)


def attention_ref(q, k, v, causal, scale):
    B, H, S, D = q.shape
    G, T_ = k.shape[1], k.shape[2]
    rep = H // G
    kk = np.repeat(k, rep, axis=1)
    vv = np.repeat(v, rep, axis=1)
    s = scale * (q @ np.swapaxes(kk, -1, -2))
    if causal:
        i = np.arange(S)[:, None]
        j = np.arange(T_)[None, :]
        s = np.where(j > i + (T_ - S), -np.inf, s)
    p = softmax(s, -1)
    smag = scale * (np.abs(q) @ np.abs(np.swapaxes(kk, -1, -2)))
    # error model: the output's terms p*v, plus score rounding (|s| terms)
    mag = (p @ np.abs(vv)) * (1.0 + np.max(np.where(np.isfinite(s), smag, 0), axis=-1, keepdims=True))
    return p @ vv, mag


def attention_case(c, dt, B, H, G, S, T_, D, E, causal, scale=None):
    q = c.inp("q", (B, H, S, D), dt)
    k = c.inp("k", (B, G, T_, D), dt)
    v = c.inp("v", (B, G, T_, E), dt)
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    ref, mag = attention_ref(q, k, v, causal, sc)
    attrs = (["causal"] if causal else []) + (["scale = %s" % fmt_f(scale)] if scale is not None else [])
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    c.op("%%o = dlopt.attention %%q, %%k, %%v%s : %s, %s, %s -> %s" % (
        at, T((B, H, S, D), dt), T((B, G, T_, D), dt), T((B, G, T_, E), dt), T((B, H, S, E), dt)))
    c.out("%o", (B, H, S, E), dt, ref, mag=mag)


add("attention.f32", attention_case, "f32", 2, 2, 2, 8, 8, 8, 8, False)
add("attention.f32.causal", attention_case, "f32", 2, 2, 2, 8, 8, 8, 8, True)
add("attention.f32.gqa.causal.E", attention_case, "f32", 2, 4, 2, 7, 7, 8, 6, True)
add("attention.f32.mqa", attention_case, "f32", 1, 4, 1, 5, 5, 16, 16, True)
add("attention.f32.S_lt_T.causal.scale", attention_case, "f32", 1, 2, 2, 5, 9, 8, 4, True, scale=0.3)
add("attention.f32.S_ne_T.noncausal", attention_case, "f32", 2, 3, 1, 6, 4, 4, 5, False)
add("attention.f32.single_query.causal", attention_case, "f32", 1, 2, 1, 1, 12, 8, 8, True)
add("attention.f32.long", attention_case, "f32", 1, 2, 2, 128, 128, 32, 32, True)
add("attention.bf16.causal", attention_case, "bf16", 1, 4, 2, 8, 8, 16, 16, True)
add("attention.f16.causal", attention_case, "f16", 1, 2, 2, 8, 8, 16, 16, True)


def rope_case(c, dt, shape, theta=None):
    x = c.inp("x", shape, dt)
    S, D = shape[-2], shape[-1]
    th = 10000.0 if theta is None else theta
    h = D // 2
    f = th ** (-2.0 * np.arange(h) / D)
    a = np.arange(S)[:, None] * f[None, :]          # [S, D/2]
    cs, sn = np.cos(a), np.sin(a)
    x1, x2 = x[..., :h], x[..., h:]
    y = np.concatenate([x1 * cs - x2 * sn, x2 * cs + x1 * sn], axis=-1)
    mag = np.concatenate([np.abs(x1) + np.abs(x2)] * 2, axis=-1) * (1 + np.concatenate([a, a], -1))
    at = " {theta = %s}" % fmt_f(theta) if theta is not None else ""
    c.op("%%y = dlopt.rope %%x%s : %s" % (at, T(shape, dt)))
    c.out("%y", shape, dt, y, mag=mag * 0.1)


add("rope.f32", rope_case, "f32", (2, 2, 6, 8))
add("rope.f32.theta", rope_case, "f32", (1, 3, 5, 16), theta=500000.0)
add("rope.f32.long", rope_case, "f32", (1, 1, 256, 32))
add("rope.bf16", rope_case, "bf16", (1, 2, 4, 8))
add("rope.f16", rope_case, "f16", (1, 2, 4, 8))


def conv_ref(x, w, b, stride, pad, dil, groups):
    N, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    sh, sw = stride
    ph, pw = pad
    dh, dw = dil
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    OH = (H + 2 * ph - dh * (KH - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    out = np.zeros((N, O, OH, OW))
    mag = np.zeros((N, O, OH, OW))
    Og = O // groups
    for g in range(groups):
        xg = xp[:, g * Cg:(g + 1) * Cg]
        wg = w[g * Og:(g + 1) * Og]
        for kh in range(KH):
            for kw in range(KW):
                patch = xg[:, :, kh * dh: kh * dh + sh * (OH - 1) + 1: sh,
                           kw * dw: kw * dw + sw * (OW - 1) + 1: sw]
                out[:, g * Og:(g + 1) * Og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, kh, kw])
                mag[:, g * Og:(g + 1) * Og] += np.einsum("nchw,oc->nohw", np.abs(patch), np.abs(wg[:, :, kh, kw]))
    if b is not None:
        out += b[None, :, None, None]
        mag += np.abs(b)[None, :, None, None]
    return out, mag


def conv_case(c, dt, xs, ws, bias=False, stride=None, pad=None, dil=None, groups=None):
    x = c.inp("x", xs, dt)
    w = c.inp("w", ws, dt, scale=0.5)
    b = c.inp("b", (ws[0],), dt) if bias else None
    ref, mag = conv_ref(x, w, b, stride or (1, 1), pad or (0, 0), dil or (1, 1), groups or 1)
    attrs = []
    for n, v in (("stride", stride), ("padding", pad), ("dilation", dil)):
        if v is not None:
            attrs.append("%s = array<i64: %d, %d>" % (n, v[0], v[1]))
    if groups is not None:
        attrs.append("groups = %d" % groups)
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    types = [T(xs, dt), T(ws, dt)] + ([T((ws[0],), dt)] if bias else [])
    c.op("%%y = dlopt.conv2d %%x, %%w%s%s : (%s) -> %s" % (
        " bias(%b)" if bias else "", at, ", ".join(types), T(ref.shape, dt)))
    c.out("%y", ref.shape, dt, ref, mag=mag)


add("conv2d.f32.default", conv_case, "f32", (2, 3, 7, 7), (4, 3, 3, 3))
add("conv2d.f32.stride_pad_bias", conv_case, "f32", (2, 3, 8, 8), (5, 3, 3, 3), bias=True, stride=(2, 2), pad=(1, 1))
add("conv2d.f32.dilation", conv_case, "f32", (1, 2, 9, 9), (3, 2, 3, 3), pad=(2, 2), dil=(2, 2))
add("conv2d.f32.groups", conv_case, "f32", (2, 4, 9, 9), (6, 2, 3, 3), bias=True, stride=(2, 2), pad=(1, 1), groups=2)
add("conv2d.f32.depthwise", conv_case, "f32", (1, 4, 6, 6), (4, 1, 3, 3), pad=(1, 1), groups=4)
add("conv2d.f32.rect", conv_case, "f32", (1, 2, 5, 9), (3, 2, 1, 3), stride=(1, 2), pad=(0, 1), dil=(1, 2))
add("conv2d.f32.1x1", conv_case, "f32", (2, 8, 4, 4), (16, 8, 1, 1), bias=True)
add("conv2d.f32.7x7s2", conv_case, "f32", (1, 3, 16, 16), (8, 3, 7, 7), stride=(2, 2), pad=(3, 3))
add("conv2d.f32.asym_all", conv_case, "f32", (1, 6, 10, 7), (4, 3, 3, 2), bias=True, stride=(3, 1), pad=(2, 0), dil=(1, 3), groups=2)
add("conv2d.bf16", conv_case, "bf16", (1, 4, 6, 6), (4, 4, 3, 3), bias=True, pad=(1, 1))
add("conv2d.f16", conv_case, "f16", (1, 4, 6, 6), (4, 2, 3, 3), stride=(2, 2), groups=2)


def pool_ref(x, kind, kernel, stride, pad, cip=True):
    N, C, H, W = x.shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = pad
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    ones = np.pad(np.ones((H, W)), ((ph, ph), (pw, pw)))
    OH = (H + 2 * ph - kh) // sh + 1
    OW = (W + 2 * pw - kw) // sw + 1
    out = np.zeros((N, C, OH, OW))
    for i in range(OH):
        for j in range(OW):
            win = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            if kind == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = kh * kw if cip else ones[i * sh:i * sh + kh, j * sw:j * sw + kw].sum()
                out[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return out


def pool_case(c, kind, dt, xs, kernel, stride=None, pad=None, cip=None):
    x = c.inp("x", xs, dt)
    ref = pool_ref(x, kind, kernel, stride or kernel, pad or (0, 0), True if cip is None else cip)
    attrs = ["kernel = array<i64: %d, %d>" % tuple(kernel)]
    if stride is not None:
        attrs.append("stride = array<i64: %d, %d>" % tuple(stride))
    if pad is not None:
        attrs.append("padding = array<i64: %d, %d>" % tuple(pad))
    if cip is not None:
        attrs.append("count_include_pad = %s" % ("true" if cip else "false"))
    c.op("%%y = dlopt.%s_pool2d %%x {%s} : %s -> %s" % (kind, ", ".join(attrs), T(xs, dt), T(ref.shape, dt)))
    c.out("%y", ref.shape, dt, ref, mag=None if kind == "max" else np.ones_like(ref) * 3)


add("max_pool2d.f32", pool_case, "max", "f32", (2, 3, 8, 8), (2, 2))
add("max_pool2d.f32.pad", pool_case, "max", "f32", (1, 2, 7, 7), (3, 3), stride=(2, 2), pad=(1, 1))
add("max_pool2d.f32.rect", pool_case, "max", "f32", (1, 2, 6, 9), (2, 3), stride=(1, 2))
add("max_pool2d.f32.negative_pad", pool_case, "max", "f32", (1, 1, 4, 4), (3, 3), stride=(1, 1), pad=(1, 1))
add("max_pool2d.bf16", pool_case, "max", "bf16", (1, 2, 4, 4), (2, 2))
add("avg_pool2d.f32", pool_case, "avg", "f32", (2, 3, 8, 8), (2, 2))
add("avg_pool2d.f32.pad.include", pool_case, "avg", "f32", (1, 2, 7, 7), (3, 3), stride=(2, 2), pad=(1, 1))
add("avg_pool2d.f32.pad.include_explicit", pool_case, "avg", "f32", (1, 2, 5, 6), (3, 3), stride=(1, 2), pad=(1, 1), cip=True)
add("avg_pool2d.f32.pad.exclude", pool_case, "avg", "f32", (1, 2, 7, 7), (3, 3), stride=(2, 2), pad=(1, 1), cip=False)
add("avg_pool2d.f32.global", pool_case, "avg", "f32", (2, 4, 5, 5), (5, 5))
add("avg_pool2d.f16", pool_case, "avg", "f16", (1, 2, 4, 4), (2, 2), pad=(1, 1), cip=False)


def bn_case(c, dt, xs, training, eps=None, momentum=None):
    C = xs[1]
    x = c.inp("x", xs, dt, scale=2.0)
    w = c.inp("w", (C,), dt, gen="uniform", lo=0.5, hi=1.5)
    b = c.inp("b", (C,), dt)
    rm = c.inp("rm", (C,), dt)
    rv = c.inp("rv", (C,), dt, gen="uniform", lo=0.5, hi=2.0)
    e = 1e-5 if eps is None else eps
    m = 0.1 if momentum is None else momentum
    axes = tuple(i for i in range(len(xs)) if i != 1)
    bshape = [1] * len(xs)
    bshape[1] = C
    if training:
        mu = x.mean(axis=axes)
        var = ((x - mu.reshape(bshape)) ** 2).mean(axis=axes)
        n = x.size // C
        y = (x - mu.reshape(bshape)) / np.sqrt(var.reshape(bshape) + e) * w.reshape(bshape) + b.reshape(bshape)
        rm2 = (1 - m) * rm + m * mu
        rv2 = (1 - m) * rv + m * var * n / (n - 1)
    else:
        y = (x - rm.reshape(bshape)) / np.sqrt(rv.reshape(bshape) + e) * w.reshape(bshape) + b.reshape(bshape)
        rm2, rv2 = rm, rv
    attrs = []
    if eps is not None:
        attrs.append("eps = %s" % fmt_f(eps))
    if momentum is not None:
        attrs.append("momentum = %s" % fmt_f(momentum))
    if training:
        attrs.append("training")
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    tc = T((C,), dt)
    c.op("%%y, %%rm2, %%rv2 = dlopt.batch_norm %%x, %%w, %%b, %%rm, %%rv%s : (%s, %s, %s, %s, %s) -> (%s, %s, %s)"
         % (at, T(xs, dt), tc, tc, tc, tc, T(xs, dt), tc, tc))
    c.out("%y", xs, dt, y, mag=np.abs(y) + 3)
    c.out("%rm2", (C,), dt, rm2, mag=np.abs(rm2) + 3)
    c.out("%rv2", (C,), dt, rv2, mag=np.abs(rv2) + 3)


add("batch_norm.f32.training", bn_case, "f32", (4, 3, 5, 5), True)
add("batch_norm.f32.training.2d.attrs", bn_case, "f32", (8, 5), True, eps=1e-3, momentum=0.25)
add("batch_norm.f32.training.3d", bn_case, "f32", (3, 4, 7), True)
add("batch_norm.f32.inference", bn_case, "f32", (4, 3, 5, 5), False)
add("batch_norm.f32.inference.attrs", bn_case, "f32", (2, 6, 3, 3), False, eps=0.1, momentum=0.5)
add("batch_norm.bf16.training", bn_case, "bf16", (4, 3, 4, 4), True)


def dropout_case(c, dt, shape, rate, seed, offset=None, odt="i64"):
    """offset: None (no operand) or the value of a rank-0 `odt` offset input."""
    x = c.inp("x", shape, dt)
    off = ""
    if offset is not None:
        o = int(c.inp("off", (), odt, data=np.array(offset)))
        off = " offset(%%off : %s)" % T((), odt)
    else:
        o = 0
    keep = (dropout_u(seed, x.size, o) >= rate).reshape(shape)
    ref = np.where(keep, x / (1.0 - rate), 0.0)
    c.op("%%y = dlopt.dropout %%x%s {rate = %s, seed = %d} : %s" % (off, fmt_f(rate), seed, T(shape, dt)))
    c.out("%y", shape, dt, ref)
    c.out_mask = keep


add("dropout.f32", dropout_case, "f32", (4, 64), 0.1, 42)
add("dropout.f32.half", dropout_case, "f32", (3, 5, 7), 0.5, 7)
add("dropout.f32.zero_rate", dropout_case, "f32", (10,), 0.0, 1)
add("dropout.f32.bigseed", dropout_case, "f32", (1000,), 0.3, 9007199254740993)
add("dropout.f32.seed0", dropout_case, "f32", (2, 50), 0.9, 0)
add("dropout.bf16", dropout_case, "bf16", (8, 16), 0.25, 43)
add("dropout.f32.offset0", dropout_case, "f32", (4, 64), 0.1, 42, 0)
add("dropout.f32.offset", dropout_case, "f32", (4, 64), 0.1, 42, 1)
add("dropout.f32.offset.big", dropout_case, "f32", (1000,), 0.3, 9007199254740993, 123456789012)
add("dropout.f32.offset.neg.i32", dropout_case, "f32", (3, 5, 7), 0.5, 7, -3, "i32")
add("dropout.f32.offset.i32", dropout_case, "f32", (2, 50), 0.9, 0, 2147483647, "i32")
add("dropout.bf16.offset", dropout_case, "bf16", (8, 16), 0.25, 43, 17)


def ce_case(c, dt, N, C, ignore=None, ldt="i32", n_ignored=2, scale=1.0):
    logits = c.inp("l", (N, C), dt, scale=scale)
    ig = -100 if ignore is None else ignore
    lab = c.rng.integers(0, C, size=N)
    if ignore is not None and ignore >= 0:
        lab = np.where(lab == ignore, (ignore + 1) % C, lab)
    lab[:n_ignored] = ig
    labels = c.inp("y", (N,), ldt, data=lab)
    at = " {ignore_index = %d}" % ignore if ignore is not None else ""
    c.op("%%loss = dlopt.cross_entropy %%l, %%y%s : %s, %s -> tensor<f32>" % (at, T((N, C), dt), T((N,), ldt)))
    rows = [i for i in range(N) if labels[i] != ig]
    if rows:
        ls = log_softmax(logits, 1)
        ref = -np.mean([ls[i, labels[i]] for i in rows])
        mag = np.mean([np.abs(ls[i]).max() + np.abs(logits[i]).max() for i in rows])
    else:
        ref, mag = 0.0, 0.0
    c.out("%loss", (), "f32", np.float64(ref), mag=mag, scale=TOLSCALE.get(dt, 1.0))


TOLSCALE = {"bf16": 2e-2 / 1e-5, "f16": 2e-3 / 1e-5}   # f32 result from 16-bit logits
add("cross_entropy.f32", ce_case, "f32", 8, 10)
add("cross_entropy.f32.ignore0", ce_case, "f32", 12, 7, ignore=0, n_ignored=3)
add("cross_entropy.f32.all_ignored", ce_case, "f32", 4, 5, n_ignored=4)
add("cross_entropy.f32.i64_labels", ce_case, "f32", 6, 9, ldt="i64", n_ignored=0)
add("cross_entropy.f32.large_logits", ce_case, "f32", 16, 128, n_ignored=1, scale=30.0)
add("cross_entropy.f32.vocab", ce_case, "f32", 32, 2000, n_ignored=0)


def mse_case(c, dt, shape):
    a = c.inp("a", shape, dt)
    b = c.inp("b", shape, dt)
    c.op("%%m = dlopt.mse %%a, %%b : %s, %s -> %s" % (T(shape, dt), T(shape, dt), T((), dt)))
    c.out("%m", (), dt, np.mean((a - b) ** 2))


add("mse.f32", mse_case, "f32", (3, 4))
add("mse.f32.long", mse_case, "f32", (64, 300))
add("mse.bf16", mse_case, "bf16", (3, 4))
add("mse.f16", mse_case, "f16", (5, 7))


# ------------------------------------------------------- composite graph

@case("graph.mlp_chain")
def _(c):
    """A few ops chained, so intermediate buffers and the planner are exercised."""
    x = c.inp("x", (4, 16), "f32")
    w = c.inp("w", (16, 8), "f32", scale=0.3)
    b = c.inp("b", (8,), "f32")
    c.op("%h = dlopt.matmul %x, %w : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>")
    c.op("%hb = dlopt.add %h, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>")
    c.op("%r = dlopt.relu %hb : tensor<4x8xf32>")
    c.op("%t = dlopt.transpose %r perm = [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>")
    c.op("%s = dlopt.sum %t dims = [1] : tensor<8x4xf32> -> tensor<8xf32>")
    h = np.maximum(x @ w + b, 0)
    c.out("%s", (8,), "f32", h.T.sum(axis=1), mag=(np.abs(x) @ np.abs(w) + np.abs(b)).sum(axis=0))
    c.out("%r", (4, 8), "f32", h, mag=np.abs(x) @ np.abs(w) + np.abs(b))


@case("graph.constant")
def _(c):
    x = c.inp("x", (4,), "f32")
    c.op("%k = arith.constant dense<[1.0, -2.0, 0.5, 4.0]> : tensor<4xf32>")
    c.op("%y = dlopt.mul %x, %k : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>")
    c.out("%y", (4,), "f32", x * np.array([1.0, -2.0, 0.5, 4.0]))


# ----------------------------------------------------------- error paths

@case("error.gather.id_too_large")
def _(c):
    c.inp("t", (10, 4), "f32")
    c.inp("ids", (2, 3), "i32", data=[[0, 1, 2], [3, 10, 4]])
    c.op("%y = dlopt.gather %t, %ids : tensor<10x4xf32>, tensor<2x3xi32> -> tensor<2x3x4xf32>")
    c.expect_error("gather", "%y", (2, 3, 4), "f32")


@case("error.gather.id_negative")
def _(c):
    c.inp("t", (10, 4), "f32")
    c.inp("ids", (3,), "i64", data=[0, -1, 2])
    c.op("%y = dlopt.gather %t, %ids : tensor<10x4xf32>, tensor<3xi64> -> tensor<3x4xf32>")
    c.expect_error("gather", "%y", (3, 4), "f32")


@case("error.cross_entropy.label_too_large")
def _(c):
    c.inp("l", (4, 5), "f32")
    c.inp("y", (4,), "i32", data=[0, 1, 5, 2])
    c.op("%loss = dlopt.cross_entropy %l, %y : tensor<4x5xf32>, tensor<4xi32> -> tensor<f32>")
    c.expect_error("cross_entropy", "%loss", (), "f32")


@case("error.cross_entropy.label_negative")
def _(c):
    c.inp("l", (4, 5), "f32")
    c.inp("y", (4,), "i32", data=[0, -100, -1, 2])
    c.op("%loss = dlopt.cross_entropy %l, %y : tensor<4x5xf32>, tensor<4xi32> -> tensor<f32>")
    c.expect_error("cross_entropy", "%loss", (), "f32")


for _dt in INTS:
    def _divzero(c, dt=_dt):
        c.inp("a", (4,), dt, data=[1, 2, 3, 4])
        c.inp("b", (4,), dt, data=[1, 0, 1, 1])
        c.op("%%z = dlopt.div %%a, %%b : %s, %s -> %s" % (T((4,), dt), T((4,), dt), T((4,), dt)))
        c.expect_error("div", "%z", (4,), dt)
    add("error.div.%s.by_zero" % _dt, _divzero)


# ---------------------------------------------------------------- driver

def run_case(name, fn, args, tools, work):
    c = Case(name, args.seed)
    c.out_mask = None
    fn(c)
    d = harness.fresh_case_dir(work, name)
    src = os.path.join(d, "case.mlir")
    with open(src, "w") as f:
        f.write(c.mlir())
    plan = os.path.join(d, "case.plan")
    r = run([tools["compile"], src, "-o", plan, "--quiet"])
    if r.returncode != 0:
        return False, "dlopt-compile failed (rc %d): %s" % (r.returncode, r.stderr.strip()[:400])
    cmd = [tools["run"], plan, "--backend", args.backend, "--quiet", "--output-dir", os.path.join(d, "out")]
    cmd += harness.input_args(d, c.args)
    r = run(cmd)
    if c.error:
        if r.returncode == 0:
            return False, "expected a runtime error naming '%s', but dlopt-run succeeded" % c.error
        if r.returncode < 0 or r.returncode >= 128:
            return False, "dlopt-run crashed (rc %d) instead of reporting an error: %s" % (
                r.returncode, r.stderr.strip()[:300])
        # the case's directory name contains the op name too: look at the
        # message without paths
        msg = r.stderr.replace(d, "<case>").replace(work, "<work>")
        if not re.search(r"\b%s\b" % re.escape(c.error), msg):
            return False, "error message does not name '%s': %s" % (c.error, r.stderr.strip()[:300])
        return True, "rc %d: %s" % (r.returncode, r.stderr.strip().splitlines()[-1][:120] if r.stderr.strip() else "")
    if r.returncode != 0:
        return False, "dlopt-run failed (rc %d): %s" % (r.returncode, r.stderr.strip()[:400])
    details = []
    ok_all = True
    for k, (ssa, ty, dt, ref, mag, scale) in enumerate(c.results):
        p = os.path.join(d, "out", "out%d.npy" % k)
        if not os.path.exists(p):
            return False, "missing output %s" % p
        got = np.load(p)
        ok, det = compare(got, ref, dt, mag=mag, scale=scale)
        if ok and c.out_mask is not None and k == 0:
            zero = got == 0
            if not np.array_equal(zero, ~c.out_mask):
                ok, det = False, "dropped-element mask differs from u(seed, i) at %d elements" % int(
                    np.sum(zero != ~c.out_mask))
        if not ok:
            ok_all = False
        details.append(("" if len(c.results) == 1 else "out%d: " % k) + det)
    return ok_all, "; ".join(details)


def main():
    return harness.main("check_ops", __doc__, CASES, run_case, "dlopt-check-ops-",
                        "inputs and case.mlir of each case", backend=True, exc_filename=True)


if __name__ == "__main__":
    sys.exit(main())
