#!/usr/bin/env python3
"""Gradient conformance: every differentiable op of docs/ops.md through
`dlopt-compile --autodiff` against central finite differences of a NumPy
float64 reference forward.

Each case builds a tiny MLIR function whose float operands are params
(`{dlopt.param = "p0"}`, `p1`, ...), marks it `{dlopt.loss}` and returns

    loss = sum(op(p...) * r)          (r: a random input "r" of op's shape)

or, for ops that return a scalar, the scalar itself (`direct`) or
`op(...) * r` with a scalar r. It is compiled with --autodiff and run with
random params bound by name; `grad.pK.npy` is compared with

    fd_j = (L(p + h e_j) - L(p - h e_j)) / 2h,  h = 1e-6 * max(1, |p_j|)

of the float64 reference loss L (references shared with check_ops.py), on
every element (params up to FULL_FD elements) or along DIRECTIONS random
directions (larger params). Data stay away from kinks (relu/abs at 0,
maximum/minimum/max/max_pool ties) except in the explicit `ties` cases,
which check the implemented tie rule exactly instead of differencing.

Pass (per param, RTOL = 1e-4): max|g - fd| <= RTOL * max(max|fd|, 1e-6), or
|g.d - fd_d| <= RTOL * ||g|| ||d|| along directions. NaN never passes. The
loss itself must match the reference too.

Compile-time behaviour is checked through stderr: a param that does not
reach the loss gets a warning naming it and an all-zero gradient; a
non-differentiable op on the path to the loss is an error naming the op and
its location; a function without a rank-0 loss is rejected.

  check_grads.py [--work-dir DIR] [--seed N] [--filter REGEX] [--list]

Prints one line per case, then `N passed, M failed`; exits 1 on any failure.
"""
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from dlopt_np import bf16_round, dropout_u, fmt_f, run, ttype as T  # noqa: E402
import check_ops as co  # noqa: E402  (references only; its cases are not run)

RTOL = 1e-4          # gradient error relative to the largest FD component (observed <= ~1e-6)
FULL_FD = 400        # params up to this many elements: FD on every element
DIRECTIONS = 8       # otherwise: this many random directional derivatives
LOSS_RTOL = 1e-5     # forward loss vs reference, relative to 1 + sum |y * r|


class GCase:
    def __init__(self, name, seed):
        self.name = name
        self.rng = harness.case_rng(seed, name)
        self.params = []      # (name, shape, stored float32)
        self.inputs = []      # (name, type, stored array)
        self.lines = []
        self.fwd = None       # f(list of float64 params) -> float64 output
        self.out = None       # (ssa, shape, direct)
        self.expect_warning = None    # param name that must be warned about
        self.expect_error = None      # (regex for stderr) for compile errors
        self.extra_results = []       # (ssa, type) returned after the loss

    # ---- data
    def normal(self, shape, scale=1.0):
        return self.rng.standard_normal(shape) * scale

    def away(self, shape, lo=0.1, hi=2.0):
        """Random signs, magnitudes in [lo, hi]: away from 0."""
        mag = self.rng.uniform(lo, hi, size=shape)
        return np.where(self.rng.random(shape) < 0.5, -mag, mag)

    def distinct(self, shape, spacing=0.05, offset=0.0):
        """All elements distinct, pairwise at least `spacing` apart."""
        n = int(np.prod(shape)) if shape else 1
        v = (self.rng.permutation(n) - n / 2.0) * spacing + offset
        v = v + self.rng.uniform(0, spacing * 0.2, size=n)
        return v.reshape(shape)

    def param(self, shape, data=None, scale=1.0):
        shape = tuple(shape)
        if data is None:
            data = self.normal(shape, scale)
        stored = np.array(data, dtype=np.float32).reshape(shape)
        name = "p%d" % len(self.params)
        self.params.append((name, shape, stored))
        return "%" + name, stored.astype(np.float64)

    def inp(self, name, shape, dt, data):
        stored = np.array(data, dtype={"f32": np.float32, "i32": np.int32, "i64": np.int64,
                                       "i1": np.bool_}[dt]).reshape(tuple(shape))
        self.inputs.append((name, T(shape, dt), stored))
        return stored.astype(np.float64) if dt == "f32" else stored

    def op(self, line):
        self.lines.append(line)

    def result(self, ssa, shape, fwd, direct=False):
        self.out = (ssa, tuple(shape), direct)
        self.fwd = fwd

    # ---- module
    def build(self):
        ssa, shape, direct = self.out
        lines = list(self.lines)
        if shape == ():
            if direct:
                loss = ssa
                self.r = None
            else:
                self.r = self.inp("r", (), "f32", self.rng.uniform(0.5, 2.0))
                lines.append("%%__loss = dlopt.mul %s, %%r : tensor<f32>, tensor<f32> -> tensor<f32>" % ssa)
                loss = "%__loss"
        else:
            self.r = self.inp("r", shape, "f32", self.normal(shape))
            t = T(shape, "f32")
            lines.append("%%__m = dlopt.mul %s, %%r : %s, %s -> %s" % (ssa, t, t, t))
            lines.append("%%__loss = dlopt.sum %%__m dims = [%s] : %s -> tensor<f32>" % (
                ", ".join(str(i) for i in range(len(shape))), t))
            loss = "%__loss"
        args = ['%%%s: %s {dlopt.input = "%s"}' % (n, t, n) for n, t, _ in self.inputs]
        args += ['%%%s: %s {dlopt.param = "%s"}' % (n, T(s, "f32"), n) for n, s, _ in self.params]
        rtypes = ['tensor<f32> {dlopt.output = "loss"}'] + [t for _, t in self.extra_results]
        rets = [loss] + [s for s, _ in self.extra_results]
        return ("func.func @main(%s)\n    -> (%s) attributes {dlopt.loss} {\n%s\n  return %s : %s\n}\n"
                % (",\n    ".join(args), ", ".join(rtypes), "\n".join("  " + l for l in lines),
                   ", ".join(rets), ", ".join(["tensor<f32>"] + [t for _, t in self.extra_results])))

    def loss_ref(self, P):
        y = np.asarray(self.fwd(P), dtype=np.float64)
        if self.r is None:
            return float(y)
        return float(np.sum(y * self.r))

    def loss_mag(self, P):
        y = np.asarray(self.fwd(P), dtype=np.float64)
        return float(np.sum(np.abs(y * (1.0 if self.r is None else self.r))))


CASES = []


def case(name):
    def deco(fn):
        CASES.append((name, fn))
        return fn
    return deco


def add(name, fn, *a, **kw):
    CASES.append((name, lambda c: fn(c, *a, **kw)))


def dims_list(v):
    return ", ".join(map(str, v))


# ---------------------------------------------------------------- unary

UNARY_DATA = {
    "neg": "normal", "abs": "away", "relu": "away", "exp": "normal",
    "log": (0.2, 4.0), "sqrt": (0.2, 4.0), "rsqrt": (0.2, 4.0),
    "tanh": "normal", "sin": "wide", "cos": "wide", "sigmoid": "wide",
    "silu": "wide", "gelu": "wide", "gelu_tanh": "wide",
}


def unary(c, op, shape=(3, 5)):
    fn = co.UNARY[op][0]
    kind = UNARY_DATA[op]
    if kind == "away":
        data = c.away(shape)
    elif kind == "wide":
        data = c.normal(shape, 2.0)
    elif isinstance(kind, tuple):
        data = c.rng.uniform(kind[0], kind[1], size=shape)
    else:
        data = c.normal(shape)
    p, _ = c.param(shape, data)
    mn = "gelu" if op == "gelu_tanh" else op
    attr = ' {approximate = "tanh"}' if op == "gelu_tanh" else ""
    c.op("%%y = dlopt.%s %s%s : %s" % (mn, p, attr, T(shape, "f32")))
    c.result("%y", shape, lambda P: fn(P[0]))


for _op in co.UNARY:
    add("%s" % _op, unary, _op)


@case("cast.f32_to_f32")
def _(c):
    p, _ = c.param((4, 3))
    c.op("%%y = dlopt.cast %s : tensor<4x3xf32> -> tensor<4x3xf32>" % p)
    c.result("%y", (4, 3), lambda P: P[0])


@case("cast.f32_bf16_f32.rule")
def _(c):
    """Rounding has no useful derivative: the rule passes the gradient
    through, cast back to the operand type (straight through)."""
    p, _ = c.param((12,))
    c.op("%%b = dlopt.cast %s : tensor<12xf32> -> tensor<12xbf16>" % p)
    c.op("%y = dlopt.cast %b : tensor<12xbf16> -> tensor<12xf32>")
    c.result("%y", (12,), lambda P: bf16_round(P[0].astype(np.float32)).astype(np.float64))
    c.expect_fn = {"p0": lambda: bf16_round(c.r.astype(np.float32)).astype(np.float64)}


# ---------------------------------------------------------------- binary

def bin_data(c, op, sa, sb):
    if op == "pow":
        return c.rng.uniform(0.3, 3.0, size=sa), c.rng.uniform(-2.0, 2.0, size=sb)
    if op == "div":
        return c.normal(sa, 2.0), c.away(sb, 0.3, 2.0)
    if op in ("maximum", "minimum"):
        # every broadcast pair at least 0.1 apart
        for _ in range(1000):
            a, b = c.normal(sa, 2.0), c.normal(sb, 2.0)
            if np.all(np.abs(a - b) > 0.1):
                return a, b
        raise RuntimeError("could not draw untied data")
    return c.normal(sa, 2.0), c.normal(sb, 2.0)


def binary(c, op, sa, sb):
    so = np.broadcast_shapes(sa, sb)
    da, db = bin_data(c, op, sa, sb)
    pa, _ = c.param(sa, da)
    pb, _ = c.param(sb, db)
    c.op("%%z = dlopt.%s %s, %s : %s, %s -> %s" % (op, pa, pb, T(sa, "f32"), T(sb, "f32"), T(so, "f32")))
    fn = co.BIN[op]
    c.result("%z", so, lambda P: fn(P[0], P[1]))


BIN_SHAPES = [("same", (3, 4), (3, 4)), ("bcast_row", (4, 5), (5,)), ("bcast_both", (3, 1), (2, 1, 4)),
              ("bcast_lhs", (1, 4), (3, 4)), ("scalar", (), (2, 3))]
for _op in co.BIN:
    for _tag, _sa, _sb in BIN_SHAPES:
        add("%s.%s" % (_op, _tag), binary, _op, _sa, _sb)


def minmax_ties(c, op):
    """Ties: the rule sends the whole gradient to the left operand
    (DLOptGradients.cpp minMaxGrad: maximum picks lhs where lhs >= rhs,
    minimum where lhs <= rhs)."""
    a = c.normal((4, 6), 2.0)
    b = c.normal((6,), 2.0)
    a[1] = b            # a whole row tied
    a[3, ::2] = b[::2]  # and some more
    pa, av = c.param((4, 6), a)
    pb, bv = c.param((6,), b)
    c.op("%%z = dlopt.%s %s, %s : tensor<4x6xf32>, tensor<6xf32> -> tensor<4x6xf32>" % (op, pa, pb))
    fn = co.BIN[op]
    c.result("%z", (4, 6), lambda P: fn(P[0], P[1]))
    pick = av >= bv if op == "maximum" else av <= bv

    def ga():
        return np.where(pick, c.r, 0.0)

    def gb():
        return np.where(pick, 0.0, c.r).sum(axis=0)
    c.expect_fn = {"p0": ga, "p1": gb}


add("maximum.ties.rule", minmax_ties, "maximum")
add("minimum.ties.rule", minmax_ties, "minimum")


def select_case(c, sc, sa, sb):
    so = np.broadcast_shapes(sc, sa, sb)
    cond = c.rng.random(sc) < 0.5
    cond.ravel()[:2] = [True, False]
    cv = c.inp("c", sc, "i1", cond)
    pa, _ = c.param(sa)
    pb, _ = c.param(sb)
    c.op("%%y = dlopt.select %%c, %s, %s : %s, %s, %s -> %s" % (
        pa, pb, T(sc, "i1"), T(sa, "f32"), T(sb, "f32"), T(so, "f32")))
    c.result("%y", so, lambda P: np.where(cv, P[0], P[1]))


add("select.same", select_case, (3, 4), (3, 4), (3, 4))
add("select.bcast", select_case, (4, 1), (4, 5), (5,))
add("select.bcast_cond", select_case, (5,), (3, 1), (2, 3, 5))


@case("select.cond_from_compare")
def _(c):
    """select(compare(gt, a, b), a, b) == maximum(a, b); compare is not
    differentiable but only feeds the condition."""
    a, b = bin_data(c, "maximum", (3, 4), (3, 4))
    pa, _ = c.param((3, 4), a)
    pb, _ = c.param((3, 4), b)
    t = T((3, 4), "f32")
    c.op("%%k = dlopt.compare gt, %s, %s : %s, %s -> %s" % (pa, pb, t, t, T((3, 4), "i1")))
    c.op("%%y = dlopt.select %%k, %s, %s : %s, %s, %s -> %s" % (pa, pb, T((3, 4), "i1"), t, t, t))
    c.result("%y", (3, 4), lambda P: np.maximum(P[0], P[1]))


# ------------------------------------------------------------ reductions

def reduce_case(c, op, shape, dims, keepdims=False):
    nd = len(shape)
    axes = tuple(sorted(d % nd for d in dims))
    data = c.distinct(shape, 0.05) if op == "max" else None
    p, _ = c.param(shape, data)
    oshape = tuple(1 if i in axes else s for i, s in enumerate(shape)) if keepdims else \
        tuple(s for i, s in enumerate(shape) if i not in axes)
    kd = " keepdims" if keepdims else ""
    c.op("%%y = dlopt.%s %s dims = [%s]%s : %s -> %s" % (
        op, p, dims_list(dims), kd, T(shape, "f32"), T(oshape, "f32")))
    f = {"sum": np.sum, "mean": np.mean, "max": np.max}[op]
    c.result("%y", oshape, lambda P: f(P[0], axis=axes, keepdims=keepdims) if axes else P[0])


for _op in ("sum", "mean", "max"):
    add("%s.keepdims" % _op, reduce_case, _op, (2, 3, 4), [1, 2], True)
    add("%s.negdims" % _op, reduce_case, _op, (2, 3, 4), [0, -1])
    add("%s.all" % _op, reduce_case, _op, (3, 5), [0, 1])
    add("%s.all.keepdims" % _op, reduce_case, _op, (2, 3, 2), [0, 1, 2], True)
    add("%s.middle" % _op, reduce_case, _op, (3, 5, 2), [1])
add("sum.nodims", reduce_case, "sum", (2, 3), [])


@case("max.ties.rule")
def _(c):
    """Ties: the gradient is shared evenly among the elements equal to the
    maximum (DLOptGradients.cpp, MaxOp)."""
    x = c.normal((4, 6))
    x[0, [1, 4]] = 3.0              # two-way tie
    x[2, [0, 2, 5]] = 2.5           # three-way tie
    x[3, :] = -1.0                  # all tied
    p, xv = c.param((4, 6), x)
    c.op("%%y = dlopt.max %s dims = [1] : tensor<4x6xf32> -> tensor<4xf32>" % p)
    c.result("%y", (4,), lambda P: P[0].max(axis=1))

    def g():
        m = xv == xv.max(axis=1, keepdims=True)
        return m * (c.r[:, None] / m.sum(axis=1, keepdims=True))
    c.expect_fn = {"p0": g}


# ---------------------------------------------------------------- matmul

def matmul_case(c, sa, sb, ta=False, tb=False):
    pa, a = c.param(sa)
    pb, b = c.param(sb)
    ref, _ = co.mm_ref(a, b, ta, tb)
    attrs = [n for n, f in (("transpose_a", ta), ("transpose_b", tb)) if f]
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    c.op("%%y = dlopt.matmul %s, %s%s : %s, %s -> %s" % (pa, pb, at, T(sa, "f32"), T(sb, "f32"),
                                                       T(ref.shape, "f32")))
    c.result("%y", ref.shape, lambda P: co.mm_ref(P[0], P[1], ta, tb)[0])


add("matmul", matmul_case, (5, 7), (7, 6))
add("matmul.ta", matmul_case, (7, 5), (7, 6), ta=True)
add("matmul.tb", matmul_case, (5, 7), (6, 7), tb=True)
add("matmul.ta_tb", matmul_case, (7, 5), (6, 7), ta=True, tb=True)
add("matmul.batch_rank2_b", matmul_case, (2, 4, 8), (6, 8), tb=True)
add("matmul.batch_rank2_a", matmul_case, (8, 6), (2, 6, 4))
add("matmul.batch_bcast.ta", matmul_case, (3, 1, 8, 4), (5, 8, 6), ta=True)
add("matmul.batch_bcast2", matmul_case, (2, 1, 3, 5), (1, 4, 5, 2))
add("matmul.batch_tb", matmul_case, (2, 3, 4, 5), (2, 3, 6, 5), tb=True)
add("matmul.large.directional", matmul_case, (24, 40), (40, 16))   # exercises the directional path


# ------------------------------------------------------------- shape ops

@case("reshape")
def _(c):
    p, _ = c.param((4, 6))
    c.op("%%y = dlopt.reshape %s : tensor<4x6xf32> -> tensor<2x3x4xf32>" % p)
    c.result("%y", (2, 3, 4), lambda P: P[0].reshape(2, 3, 4))


@case("reshape.to_scalar")
def _(c):
    p, _ = c.param((1, 1))
    c.op("%%y = dlopt.reshape %s : tensor<1x1xf32> -> tensor<f32>" % p)
    c.result("%y", (), lambda P: P[0].reshape(()))


def transpose_case(c, shape, perm):
    p, x = c.param(shape)
    oshape = np.transpose(x, perm).shape
    c.op("%%y = dlopt.transpose %s perm = [%s] : %s -> %s" % (p, dims_list(perm), T(shape, "f32"),
                                                            T(oshape, "f32")))
    c.result("%y", oshape, lambda P: np.transpose(P[0], perm))


add("transpose.2d", transpose_case, (4, 6), (1, 0))
add("transpose.3d", transpose_case, (2, 3, 4), (2, 0, 1))
add("transpose.4d", transpose_case, (2, 3, 2, 4), (3, 2, 0, 1))


def bcast_case(c, shape, oshape):
    p, _ = c.param(shape)
    c.op("%%y = dlopt.broadcast_to %s : %s -> %s" % (p, T(shape, "f32"), T(oshape, "f32")))
    c.result("%y", oshape, lambda P: np.broadcast_to(P[0], oshape))


add("broadcast_to.lead", bcast_case, (1, 4), (3, 2, 4))
add("broadcast_to.mid", bcast_case, (3, 1, 2), (2, 3, 4, 2))
add("broadcast_to.scalar", bcast_case, (), (2, 3))
add("broadcast_to.col", bcast_case, (4, 1), (4, 5))


def concat_case(c, shapes, dim):
    ps = [c.param(s)[0] for s in shapes]
    oshape = list(shapes[0])
    oshape[dim] = sum(s[dim] for s in shapes)
    c.op("%%y = dlopt.concat %s dim = %d : %s -> %s" % (", ".join(ps), dim,
                                                        ", ".join(T(s, "f32") for s in shapes),
                                                        T(oshape, "f32")))
    c.result("%y", oshape, lambda P: np.concatenate(P, axis=dim))


add("concat.dim0", concat_case, [(2, 4), (3, 4)], 0)
add("concat.dim1.three", concat_case, [(2, 3, 4), (2, 1, 4), (2, 2, 4)], 1)
add("concat.last", concat_case, [(2, 3), (2, 5)], 1)
add("concat.single", concat_case, [(2, 3)], 0)


def slice_case(c, shape, start, limit, stride):
    p, x = c.param(shape)
    sl = tuple(slice(a, b, s) for a, b, s in zip(start, limit, stride))
    oshape = x[sl].shape
    c.op("%%y = dlopt.slice %s start = [%s] limit = [%s] stride = [%s] : %s -> %s" % (
        p, dims_list(start), dims_list(limit), dims_list(stride), T(shape, "f32"), T(oshape, "f32")))
    c.result("%y", oshape, lambda P: P[0][sl])


add("slice.stride", slice_case, (4, 8), [0, 1], [4, 8], [1, 2])
add("slice.strides3d", slice_case, (5, 8, 9), [1, 0, 2], [5, 7, 9], [2, 3, 4])
add("slice.unit", slice_case, (6, 7), [2, 3], [3, 7], [1, 1])


@case("slice.overlapping_twice")
def _(c):
    """Two slices of one param that overlap: their gradients must add."""
    p, _ = c.param((10,))
    c.op("%%a = dlopt.slice %s start = [0] limit = [6] stride = [1] : tensor<10xf32> -> tensor<6xf32>" % p)
    c.op("%%b = dlopt.slice %s start = [1] limit = [10] stride = [3] : tensor<10xf32> -> tensor<3xf32>" % p)
    c.op("%y = dlopt.concat %a, %b dim = 0 : tensor<6xf32>, tensor<3xf32> -> tensor<9xf32>")
    c.result("%y", (9,), lambda P: np.concatenate([P[0][0:6], P[0][1:10:3]]))


def gather_case(c, tshape, ishape, idt, forced=None):
    p, _ = c.param(tshape)
    ids = c.rng.integers(0, tshape[0], size=ishape)
    if forced:
        ids.ravel()[:len(forced)] = forced      # repeated ids
    idv = c.inp("ids", ishape, idt, ids)
    oshape = tuple(ishape) + tuple(tshape[1:])
    c.op("%%y = dlopt.gather %s, %%ids : %s, %s -> %s" % (p, T(tshape, "f32"), T(ishape, idt), T(oshape, "f32")))
    c.result("%y", oshape, lambda P: P[0][idv])


add("gather.repeated_ids", gather_case, (6, 4), (2, 5), "i32", forced=[3, 3, 3, 0, 3])
add("gather.i64.1d_table", gather_case, (7,), (3, 4), "i64", forced=[1, 1, 6, 6])
add("gather.3d_table", gather_case, (5, 2, 3), (4,), "i32", forced=[2, 2])


# ---------------------------------------------------------------- NN ops

def softmax_case(c, op, shape, dim):
    p, _ = c.param(shape, c.normal(shape, 2.0))
    ax = dim % len(shape)
    c.op("%%y = dlopt.%s %s dim = %d : %s" % (op, p, dim, T(shape, "f32")))
    f = co.softmax if op == "softmax" else co.log_softmax
    c.result("%y", shape, lambda P: f(P[0], ax))


for _op in ("softmax", "log_softmax"):
    add("%s.last" % _op, softmax_case, _op, (2, 3, 5), 2)
    add("%s.mid" % _op, softmax_case, _op, (2, 4, 3), 1)
    add("%s.dim0" % _op, softmax_case, _op, (5, 3), 0)
    add("%s.negdim" % _op, softmax_case, _op, (3, 6), -1)


def norm_ref(x, w, b, ax, eps, rms):
    red = tuple(range(ax, x.ndim))
    if rms:
        n = x / np.sqrt((x * x).mean(axis=red, keepdims=True) + eps)
    else:
        mu = x.mean(axis=red, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=red, keepdims=True)
        n = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        n = n * w
    if b is not None:
        n = n + b
    return n


def norm_case(c, shape, axis=None, w=True, b=True, eps=None, rms=False):
    nd = len(shape)
    ax = nd - 1 if axis is None else axis % nd
    x = c.normal(shape, 2.0) + (0.0 if rms else 3.0)
    px, _ = c.param(shape, x)
    ns = tuple(shape[ax:])
    operands, types, attrs = [px], [T(shape, "f32")], []
    has_w, has_b = w, b and not rms
    if has_w:
        pw, _ = c.param(ns, c.rng.uniform(0.5, 1.5, size=ns))
        operands.append("weight(%s)" % pw)
        types.append(T(ns, "f32"))
    if has_b:
        pb, _ = c.param(ns)
        operands.append("bias(%s)" % pb)
        types.append(T(ns, "f32"))
    if axis is not None:
        attrs.append("axis = %d" % axis)
    if eps is not None:
        attrs.append("eps = %s" % fmt_f(eps))
    e = (1e-6 if rms else 1e-5) if eps is None else eps
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    opn = "rms_norm" if rms else "layer_norm"
    c.op("%%y = dlopt.%s %s%s : (%s) -> %s" % (opn, " ".join(operands), at, ", ".join(types), T(shape, "f32")))

    def f(P):
        i = 1
        wv = bv = None
        if has_w:
            wv, i = P[i], i + 1
        if has_b:
            bv = P[i]
        return norm_ref(P[0], wv, bv, ax, e, rms)
    c.result("%y", shape, f)


add("layer_norm.wb", norm_case, (2, 3, 6))
add("layer_norm.none", norm_case, (3, 8), w=False, b=False)
add("layer_norm.bias_only.axis", norm_case, (2, 3, 5), axis=2, w=False)
add("layer_norm.weight_only", norm_case, (4, 6), b=False)
add("layer_norm.axis1.eps", norm_case, (2, 3, 4), axis=1, eps=1e-3)
add("layer_norm.axis_neg2", norm_case, (2, 2, 3, 4), axis=-2)
add("rms_norm.w", norm_case, (2, 3, 6), rms=True)
add("rms_norm.now", norm_case, (3, 8), w=False, rms=True)
add("rms_norm.axis1.eps", norm_case, (2, 3, 4), axis=1, eps=1e-2, rms=True)


def attention_case(c, B, H, G, S, T_, D, E, causal, scale=None):
    pq, _ = c.param((B, H, S, D))
    pk, _ = c.param((B, G, T_, D))
    pv, _ = c.param((B, G, T_, E))
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    attrs = (["causal"] if causal else []) + (["scale = %s" % fmt_f(scale)] if scale is not None else [])
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    c.op("%%o = dlopt.attention %s, %s, %s%s : %s, %s, %s -> %s" % (
        pq, pk, pv, at, T((B, H, S, D), "f32"), T((B, G, T_, D), "f32"), T((B, G, T_, E), "f32"),
        T((B, H, S, E), "f32")))
    c.result("%o", (B, H, S, E), lambda P: co.attention_ref(P[0], P[1], P[2], causal, sc)[0])


add("attention", attention_case, 2, 2, 2, 5, 5, 4, 4, False)
add("attention.causal", attention_case, 2, 2, 2, 6, 6, 4, 4, True)
add("attention.gqa.causal.E", attention_case, 1, 4, 2, 5, 5, 4, 3, True)
add("attention.mqa.causal", attention_case, 1, 3, 1, 4, 4, 4, 4, True)
add("attention.S_lt_T.causal.scale", attention_case, 1, 2, 2, 3, 6, 4, 2, True, scale=0.7)
add("attention.S_ne_T.gqa", attention_case, 2, 2, 1, 5, 3, 4, 3, False)


def rope_ref(x, theta):
    S, D = x.shape[-2], x.shape[-1]
    h = D // 2
    f = theta ** (-2.0 * np.arange(h) / D)
    a = np.arange(S)[:, None] * f[None, :]
    cs, sn = np.cos(a), np.sin(a)
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cs - x2 * sn, x2 * cs + x1 * sn], axis=-1)


def rope_case(c, shape, theta=None):
    p, _ = c.param(shape)
    at = " {theta = %s}" % fmt_f(theta) if theta is not None else ""
    c.op("%%y = dlopt.rope %s%s : %s" % (p, at, T(shape, "f32")))
    th = 10000.0 if theta is None else theta
    c.result("%y", shape, lambda P: rope_ref(P[0], th))


add("rope", rope_case, (2, 2, 5, 6))
add("rope.theta", rope_case, (1, 2, 4, 8), theta=100.0)


def conv_case(c, xs, ws, bias=False, stride=None, pad=None, dil=None, groups=None):
    px, _ = c.param(xs)
    pw, _ = c.param(ws, c.normal(ws, 0.5))
    pb = c.param((ws[0],))[0] if bias else None
    st, pd, dl, gr = stride or (1, 1), pad or (0, 0), dil or (1, 1), groups or 1
    ref, _ = co.conv_ref(np.zeros(xs), np.zeros(ws), None, st, pd, dl, gr)
    attrs = []
    for n, v in (("stride", stride), ("padding", pad), ("dilation", dil)):
        if v is not None:
            attrs.append("%s = array<i64: %d, %d>" % (n, v[0], v[1]))
    if groups is not None:
        attrs.append("groups = %d" % groups)
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    types = [T(xs, "f32"), T(ws, "f32")] + ([T((ws[0],), "f32")] if bias else [])
    c.op("%%y = dlopt.conv2d %s, %s%s%s : (%s) -> %s" % (
        px, pw, " bias(%s)" % pb if bias else "", at, ", ".join(types), T(ref.shape, "f32")))
    c.result("%y", ref.shape, lambda P: co.conv_ref(P[0], P[1], P[2] if bias else None, st, pd, dl, gr)[0])


add("conv2d", conv_case, (2, 2, 5, 5), (3, 2, 3, 3))
add("conv2d.stride_pad_bias", conv_case, (1, 2, 6, 6), (3, 2, 3, 3), bias=True, stride=(2, 2), pad=(1, 1))
add("conv2d.dilation", conv_case, (1, 2, 7, 7), (2, 2, 3, 3), pad=(2, 2), dil=(2, 2))
add("conv2d.groups.bias", conv_case, (2, 4, 5, 5), (6, 2, 3, 3), bias=True, stride=(2, 2), pad=(1, 1), groups=2)
add("conv2d.depthwise", conv_case, (1, 3, 5, 5), (3, 1, 3, 3), pad=(1, 1), groups=3)
add("conv2d.rect", conv_case, (1, 2, 5, 8), (3, 2, 1, 3), stride=(1, 2), pad=(0, 1), dil=(1, 2))
add("conv2d.asym_all", conv_case, (1, 4, 8, 7), (4, 2, 3, 2), bias=True, stride=(3, 1), pad=(2, 0), dil=(1, 3), groups=2)
add("conv2d.1x1.bias", conv_case, (2, 3, 3, 3), (4, 3, 1, 1), bias=True)


def pool_case(c, kind, xs, kernel, stride=None, pad=None, cip=None, negative=False):
    data = c.distinct(xs, 0.05, offset=-20.0 if negative else 0.0) if kind == "max" else None
    p, _ = c.param(xs, data)
    st, pd = stride or kernel, pad or (0, 0)
    ci = True if cip is None else cip
    ref = co.pool_ref(np.zeros(xs), kind, kernel, st, pd, ci)
    attrs = ["kernel = array<i64: %d, %d>" % tuple(kernel)]
    if stride is not None:
        attrs.append("stride = array<i64: %d, %d>" % tuple(stride))
    if pad is not None:
        attrs.append("padding = array<i64: %d, %d>" % tuple(pad))
    if cip is not None:
        attrs.append("count_include_pad = %s" % ("true" if cip else "false"))
    c.op("%%y = dlopt.%s_pool2d %s {%s} : %s -> %s" % (kind, p, ", ".join(attrs), T(xs, "f32"),
                                                       T(ref.shape, "f32")))
    c.result("%y", ref.shape, lambda P: co.pool_ref(P[0], kind, kernel, st, pd, ci))


add("max_pool2d", pool_case, "max", (2, 2, 4, 4), (2, 2))
add("max_pool2d.pad.overlap", pool_case, "max", (1, 2, 7, 7), (3, 3), stride=(2, 2), pad=(1, 1))
add("max_pool2d.rect", pool_case, "max", (1, 2, 4, 7), (2, 3), stride=(1, 2))
add("max_pool2d.negative_pad", pool_case, "max", (1, 1, 4, 4), (3, 3), stride=(1, 1), pad=(1, 1), negative=True)
add("avg_pool2d", pool_case, "avg", (2, 2, 4, 4), (2, 2))
add("avg_pool2d.pad.include", pool_case, "avg", (1, 2, 7, 7), (3, 3), stride=(2, 2), pad=(1, 1))
add("avg_pool2d.pad.exclude", pool_case, "avg", (1, 2, 7, 7), (3, 3), stride=(2, 2), pad=(1, 1), cip=False)
add("avg_pool2d.overlap.exclude", pool_case, "avg", (1, 2, 5, 6), (3, 3), stride=(1, 2), pad=(1, 1), cip=False)
add("avg_pool2d.global", pool_case, "avg", (2, 3, 4, 4), (4, 4))


@case("max_pool2d.ties.rule")
def _(c):
    """Ties: each output's gradient goes to the first maximum of its window,
    scanned row-major (docs/ops.md, max_pool2d_grad)."""
    x = np.round(c.normal((1, 2, 6, 6)) * 1.5)    # small integers: many ties
    x[0, 0, 0:2, 0:2] = 2.0                        # a fully tied window
    p, xv = c.param((1, 2, 6, 6), x)
    kernel, st, pd = (3, 3), (1, 1), (1, 1)
    c.op("%%y = dlopt.max_pool2d %s {kernel = array<i64: 3, 3>, stride = array<i64: 1, 1>, "
         "padding = array<i64: 1, 1>} : tensor<1x2x6x6xf32> -> tensor<1x2x6x6xf32>" % p)
    c.result("%y", (1, 2, 6, 6), lambda P: co.pool_ref(P[0], "max", kernel, st, pd))

    def g():
        N, C, H, W = xv.shape
        out = np.zeros_like(xv)
        for n in range(N):
            for ch in range(C):
                for i in range(H):
                    for j in range(W):
                        best, arg = -np.inf, None
                        for a in range(i - 1, i + 2):
                            for b in range(j - 1, j + 2):
                                if 0 <= a < H and 0 <= b < W and xv[n, ch, a, b] > best:
                                    best, arg = xv[n, ch, a, b], (a, b)
                        out[n, ch][arg] += c.r[n, ch, i, j]
        return out
    c.expect_fn = {"p0": g}


def bn_case(c, xs, training, eps=None, momentum=None):
    C = xs[1]
    px, _ = c.param(xs, c.normal(xs, 2.0) + 1.0)
    pw, _ = c.param((C,), c.rng.uniform(0.5, 1.5, size=C))
    pb, _ = c.param((C,))
    rm = c.inp("rm", (C,), "f32", c.normal((C,)))
    rv = c.inp("rv", (C,), "f32", c.rng.uniform(0.5, 2.0, size=C))
    e = 1e-5 if eps is None else eps
    axes = tuple(i for i in range(len(xs)) if i != 1)
    bsh = [1] * len(xs)
    bsh[1] = C

    def f(P):
        x, w, b = P
        if training:
            mu = x.mean(axis=axes, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
        else:
            mu, var = rm.reshape(bsh), rv.reshape(bsh)
        return (x - mu) / np.sqrt(var + e) * w.reshape(bsh) + b.reshape(bsh)
    attrs = []
    if eps is not None:
        attrs.append("eps = %s" % fmt_f(eps))
    if momentum is not None:
        attrs.append("momentum = %s" % fmt_f(momentum))
    if training:
        attrs.append("training")
    at = " {%s}" % ", ".join(attrs) if attrs else ""
    tc = T((C,), "f32")
    c.op("%%y, %%rm2, %%rv2 = dlopt.batch_norm %s, %s, %s, %%rm, %%rv%s : (%s, %s, %s, %s, %s) -> (%s, %s, %s)"
         % (px, pw, pb, at, T(xs, "f32"), tc, tc, tc, tc, T(xs, "f32"), tc, tc))
    c.result("%y", xs, f)


add("batch_norm.training", bn_case, (3, 2, 3, 3), True)
add("batch_norm.training.2d.attrs", bn_case, (6, 4), True, eps=1e-3, momentum=0.25)
add("batch_norm.training.3d", bn_case, (3, 3, 4), True)
add("batch_norm.inference", bn_case, (3, 2, 3, 3), False)
add("batch_norm.inference.attrs", bn_case, (2, 3, 2, 2), False, eps=0.1, momentum=0.5)


@case("batch_norm.training.running_stats_returned")
def _(c):
    """The running statistics are extra outputs; only y reaches the loss."""
    bn_case(c, (4, 3), True)
    c.extra_results = [("%rm2", "tensor<3xf32>"), ("%rv2", "tensor<3xf32>")]


def dropout_case(c, shape, rate, seed):
    p, x = c.param(shape)
    keep = (dropout_u(seed, x.size) >= rate).reshape(shape)
    c.op("%%y = dlopt.dropout %s {rate = %s, seed = %d} : %s" % (p, fmt_f(rate), seed, T(shape, "f32")))
    c.result("%y", shape, lambda P: np.where(keep, P[0] / (1.0 - rate), 0.0))


add("dropout", dropout_case, (4, 16), 0.1, 42)
add("dropout.half.3d", dropout_case, (3, 5, 7), 0.5, 7)
add("dropout.zero_rate", dropout_case, (10,), 0.0, 1)


def ce_case(c, N, C, ignore=None, ldt="i32", n_ignored=2, direct=True, scale=1.0):
    p, _ = c.param((N, C), c.normal((N, C), scale))
    ig = -100 if ignore is None else ignore
    lab = c.rng.integers(0, C, size=N)
    if ignore is not None and ignore >= 0:
        lab = np.where(lab == ignore, (ignore + 1) % C, lab)
    lab[:n_ignored] = ig
    labels = c.inp("y", (N,), ldt, lab)
    at = " {ignore_index = %d}" % ignore if ignore is not None else ""
    c.op("%%l = dlopt.cross_entropy %s, %%y%s : %s, %s -> tensor<f32>" % (p, at, T((N, C), "f32"), T((N,), ldt)))
    rows = [i for i in range(N) if labels[i] != ig]

    def f(P):
        if not rows:
            return np.float64(0.0)
        ls = co.log_softmax(P[0], 1)
        return -np.mean([ls[i, labels[i]] for i in rows])
    c.result("%l", (), f, direct=direct)


add("cross_entropy", ce_case, 6, 5)
add("cross_entropy.scaled", ce_case, 6, 5, direct=False)
add("cross_entropy.ignore0.i64", ce_case, 8, 4, ignore=0, ldt="i64", n_ignored=3)
add("cross_entropy.all_ignored", ce_case, 4, 5, n_ignored=4)
add("cross_entropy.large_logits", ce_case, 5, 7, n_ignored=1, scale=10.0)


def mse_case(c, shape, direct=True):
    pa, _ = c.param(shape)
    pb, _ = c.param(shape)
    c.op("%%m = dlopt.mse %s, %s : %s, %s -> tensor<f32>" % (pa, pb, T(shape, "f32"), T(shape, "f32")))
    c.result("%m", (), lambda P: np.mean((P[0] - P[1]) ** 2), direct=direct)


add("mse", mse_case, (3, 4))
add("mse.scaled.3d", mse_case, (2, 3, 2), direct=False)


# ------------------------------------------------------- composite graphs

@case("graph.fanout")
def _(c):
    """One param used several times: its gradients must add up."""
    p, _ = c.param((3, 4), c.normal((3, 4), 0.7))
    t = T((3, 4), "f32")
    c.op("%%a = dlopt.mul %s, %s : %s, %s -> %s" % (p, p, t, t, t))
    c.op("%%b = dlopt.exp %s : %s" % (p, t))
    c.op("%%d = dlopt.add %%a, %%b : %s, %s -> %s" % (t, t, t))
    c.op("%%e = dlopt.mul %%d, %s : %s, %s -> %s" % (p, t, t, t))
    c.result("%e", (3, 4), lambda P: (P[0] * P[0] + np.exp(P[0])) * P[0])


@case("graph.iota_times_param")
def _(c):
    """iota has no operands; it may feed a differentiable op."""
    p, _ = c.param((3, 4))
    c.op("%i = dlopt.iota dim = 1 : tensor<3x4xf32>")
    c.op("%%y = dlopt.mul %%i, %s : tensor<3x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>" % p)
    c.result("%y", (3, 4), lambda P: np.arange(4)[None, :] * P[0])


@case("graph.mlp_ce")
def _(c):
    """x @ w1 + b1 -> gelu -> @ w2 (transpose_b) -> cross_entropy."""
    x = c.inp("x", (5, 6), "f32", c.normal((5, 6)))
    labels = c.inp("y", (5,), "i32", c.rng.integers(0, 4, size=5))
    c.param((6, 8), c.normal((6, 8), 0.5))
    c.param((8,), c.normal((8,), 0.1))
    c.param((4, 8), c.normal((4, 8), 0.5))
    c.op("%h = dlopt.matmul %x, %p0 : tensor<5x6xf32>, tensor<6x8xf32> -> tensor<5x8xf32>")
    c.op("%hb = dlopt.add %h, %p1 : tensor<5x8xf32>, tensor<8xf32> -> tensor<5x8xf32>")
    c.op("%a = dlopt.gelu %hb : tensor<5x8xf32>")
    c.op("%o = dlopt.matmul %a, %p2 {transpose_b} : tensor<5x8xf32>, tensor<4x8xf32> -> tensor<5x4xf32>")
    c.op("%l = dlopt.cross_entropy %o, %y : tensor<5x4xf32>, tensor<5xi32> -> tensor<f32>")
    gelu = co.UNARY["gelu"][0]

    def f(P):
        o = gelu(x @ P[0] + P[1]) @ P[2].T
        ls = co.log_softmax(o, 1)
        return -np.mean(ls[np.arange(5), labels])
    c.result("%l", (), f, direct=True)


@case("graph.attention_block")
def _(c):
    """layer_norm -> q/k/v projections -> rope -> causal attention -> residual."""
    B, S, D, H = 1, 4, 8, 2
    hd = D // H
    x = c.inp("x", (B, S, D), "f32", c.normal((B, S, D)))
    c.param((D,), c.rng.uniform(0.5, 1.5, size=D))
    c.param((D, 3 * D), c.normal((D, 3 * D), 0.4))
    t = lambda *s: T(s, "f32")
    c.op("%%n = dlopt.layer_norm %%x weight(%%p0) : (%s, %s) -> %s" % (t(B, S, D), t(D), t(B, S, D)))
    c.op("%%qkv = dlopt.matmul %%n, %%p1 : %s, %s -> %s" % (t(B, S, D), t(D, 3 * D), t(B, S, 3 * D)))
    for i, nm in enumerate("qkv"):
        c.op("%%%s0 = dlopt.slice %%qkv start = [0, 0, %d] limit = [%d, %d, %d] stride = [1, 1, 1] : %s -> %s"
             % (nm, i * D, B, S, (i + 1) * D, t(B, S, 3 * D), t(B, S, D)))
        c.op("%%%s1 = dlopt.reshape %%%s0 : %s -> %s" % (nm, nm, t(B, S, D), t(B, S, H, hd)))
        c.op("%%%s2 = dlopt.transpose %%%s1 perm = [0, 2, 1, 3] : %s -> %s" % (nm, nm, t(B, S, H, hd), t(B, H, S, hd)))
    c.op("%%qr = dlopt.rope %%q2 : %s" % t(B, H, S, hd))
    c.op("%%kr = dlopt.rope %%k2 : %s" % t(B, H, S, hd))
    c.op("%%o = dlopt.attention %%qr, %%kr, %%v2 {causal} : %s, %s, %s -> %s" % ((t(B, H, S, hd),) * 4))
    c.op("%%ot = dlopt.transpose %%o perm = [0, 2, 1, 3] : %s -> %s" % (t(B, H, S, hd), t(B, S, H, hd)))
    c.op("%%or = dlopt.reshape %%ot : %s -> %s" % (t(B, S, H, hd), t(B, S, D)))
    c.op("%%y = dlopt.add %%or, %%x : %s, %s -> %s" % (t(B, S, D), t(B, S, D), t(B, S, D)))

    def f(P):
        n = norm_ref(x, P[0], None, 2, 1e-5, False)
        qkv = n @ P[1]
        hs = [qkv[..., i * D:(i + 1) * D].reshape(B, S, H, hd).transpose(0, 2, 1, 3) for i in range(3)]
        o, _ = co.attention_ref(rope_ref(hs[0], 1e4), rope_ref(hs[1], 1e4), hs[2], True, 1 / math.sqrt(hd))
        return o.transpose(0, 2, 1, 3).reshape(B, S, D) + x
    c.result("%y", (B, S, D), f)


# ------------------------------------------ compile-time warnings and errors

@case("unused_param.warning_zero_grad")
def _(c):
    p, _ = c.param((4,))
    c.param((2, 3))            # p1 never used
    c.op("%%y = dlopt.tanh %s : tensor<4xf32>" % p)
    c.result("%y", (4,), lambda P: np.tanh(P[0]))
    c.expect_warning = "p1"
    c.expect_fn = {"p1": lambda: np.zeros((2, 3))}


@case("int_cast_path.warning_zero_grad")
def _(c):
    """f32 -> i32 -> f32 is piecewise constant: no gradient flows (zero,
    with the 'does not reach the loss' warning)."""
    p, _ = c.param((5,), c.rng.uniform(0.2, 0.8, size=5) + np.arange(5))
    c.op("%%i = dlopt.cast %s : tensor<5xf32> -> tensor<5xi32>" % p)
    c.op("%f = dlopt.cast %i : tensor<5xi32> -> tensor<5xf32>")
    c.result("%f", (5,), lambda P: np.trunc(P[0]))
    c.expect_warning = "p0"
    c.expect_fn = {"p0": lambda: np.zeros(5)}


@case("error.softmax_grad_on_path")
def _(c):
    p, _ = c.param((2, 4))
    c.inp("d", (2, 4), "f32", c.normal((2, 4)))
    c.op("%%y = dlopt.softmax_grad %s, %%d dim = 1 : tensor<2x4xf32>" % p)
    c.result("%y", (2, 4), None)
    c.expect_error = r"case\.mlir:\d+:\d+: error: .*'dlopt\.softmax_grad' is not differentiable"


@case("error.scatter_add_on_path")
def _(c):
    p, _ = c.param((3, 2))
    c.inp("ids", (3,), "i32", [0, 2, 2])
    c.op("%%y = dlopt.scatter_add %%ids, %s : tensor<3xi32>, tensor<3x2xf32> -> tensor<4x2xf32>" % p)
    c.result("%y", (4, 2), None)
    c.expect_error = r"case\.mlir:\d+:\d+: error: .*'dlopt\.scatter_add' is not differentiable"


@case("error.attention_grad_on_path")
def _(c):
    pq, _ = c.param((1, 1, 2, 2))
    t = "tensor<1x1x2x2xf32>"
    c.op("%%dq, %%dk, %%dv = dlopt.attention_grad %s, %s, %s, %s {scale = 1.0 : f64} : (%s, %s, %s, %s) -> (%s, %s, %s)"
         % ((pq,) * 4 + (t,) * 7))
    c.result("%dq", (1, 1, 2, 2), None)
    c.expect_error = r"case\.mlir:\d+:\d+: error: .*'dlopt\.attention_grad' is not differentiable"


@case("error.no_scalar_loss")
def _(c):
    """A dlopt.loss function whose first result is not rank 0."""
    p, _ = c.param((4,))
    c.op("%%y = dlopt.tanh %s : tensor<4xf32>" % p)
    c.result("%y", (4,), None)
    c.raw_mlir = ('func.func @main(%p0: tensor<4xf32> {dlopt.param = "p0"}) -> (tensor<4xf32> {dlopt.output = "loss"})'
                  ' attributes {dlopt.loss} {\n  %y = dlopt.tanh %p0 : tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n')
    c.expect_error = r"(rank-0|scalar|rank 0)"


@case("error.autodiff_without_loss_attr")
def _(c):
    p, _ = c.param((4,))
    c.result("%y", (), None)
    c.raw_mlir = ('func.func @main(%p0: tensor<4xf32> {dlopt.param = "p0"}) -> (tensor<f32> {dlopt.output = "loss"}) {\n'
                  '  %y = dlopt.sum %p0 dims = [0] : tensor<4xf32> -> tensor<f32>\n  return %y : tensor<f32>\n}\n')
    c.expect_error = r"dlopt\.loss"


# ---------------------------------------------------------------- driver

def fd_check(c, P, i, got):
    """Compares `got` (dlopt's gradient of param i) with central differences."""
    x = P[i]
    n = x.size

    def L_at(xi):
        Q = list(P)
        Q[i] = xi
        return c.loss_ref(Q)

    if n <= FULL_FD:
        fd = np.zeros(n)
        flat = x.ravel()
        for j in range(n):
            h = 1e-6 * max(1.0, abs(flat[j]))
            xp, xm = flat.copy(), flat.copy()
            xp[j] += h
            xm[j] -= h
            fd[j] = (L_at(xp.reshape(x.shape)) - L_at(xm.reshape(x.shape))) / (2 * h)
        fd = fd.reshape(x.shape)
        err = np.abs(got - fd)
        scale = max(np.abs(fd).max() if n else 0.0, 1e-6)
        k = int(np.argmax(err)) if n else 0
        ratio = err.max() / (RTOL * scale) if n else 0.0
        det = "rel err %.1e" % (ratio * RTOL)
        if ratio > 1.0:
            idx = tuple(int(t) for t in np.unravel_index(k, x.shape)) if x.shape else ()
            return False, "%d/%d elements off; worst at %s: got %.8g, fd %.8g; %s" % (
                int(np.sum(err > RTOL * scale)), n, idx, got.ravel()[k], fd.ravel()[k], det)
        return True, det
    worst = 0.0
    gn = np.linalg.norm(got)
    for _ in range(DIRECTIONS):
        d = c.rng.standard_normal(x.shape)
        d /= np.linalg.norm(d)
        h = 1e-6 * max(1.0, np.abs(x).max())
        fd = (L_at(x + h * d) - L_at(x - h * d)) / (2 * h)
        gd = float(np.sum(got * d))
        ratio = abs(gd - fd) / (RTOL * max(gn, 1e-6))
        worst = max(worst, ratio)
        if ratio > 1.0:
            return False, "directional: g.d %.8g, fd %.8g (|g| %.4g)" % (gd, fd, gn)
    return True, "%d directions, rel err %.1e" % (DIRECTIONS, worst * RTOL)


def run_case(name, fn, args, tools, work):
    c = GCase(name, args.seed)
    c.expect_fn = {}
    c.raw_mlir = None
    fn(c)
    d = harness.fresh_case_dir(work, name)
    src = os.path.join(d, "case.mlir")
    text = c.raw_mlir if c.raw_mlir is not None else c.build()
    with open(src, "w") as f:
        f.write(text)
    plan = os.path.join(d, "case.plan")
    r = run([tools["compile"], "--autodiff", src, "-o", plan, "--quiet"])
    stderr = r.stderr
    if c.expect_error:
        if r.returncode == 0:
            return False, "expected a compile error matching /%s/, but dlopt-compile succeeded" % c.expect_error
        if r.returncode < 0 or r.returncode >= 128:
            return False, "dlopt-compile crashed (rc %d): %s" % (r.returncode, stderr.strip()[:300])
        if not re.search(c.expect_error, stderr):
            return False, "error does not match /%s/: %s" % (c.expect_error, stderr.strip()[:400])
        first = [l for l in stderr.splitlines() if "error" in l]
        return True, "rc %d: %s" % (r.returncode, (first[0] if first else "").replace(d + "/", "")[:140])
    if r.returncode != 0:
        return False, "dlopt-compile --autodiff failed (rc %d): %s" % (r.returncode, stderr.strip()[:600])
    warned = re.findall(r"parameter '([^']+)' does not reach the loss", stderr)
    if c.expect_warning:
        if c.expect_warning not in warned:
            return False, "no 'does not reach the loss' warning for %s: %s" % (c.expect_warning, stderr.strip()[:300])
    elif warned or "warning" in stderr:
        return False, "unexpected compile warning: %s" % stderr.strip()[:300]
    cmd = [tools["run"], plan, "--quiet", "--output-dir", os.path.join(d, "out")]
    cmd += harness.input_args(d, c.inputs) + harness.input_args(d, c.params)
    r = run(cmd)
    if r.returncode != 0:
        return False, "dlopt-run failed (rc %d): %s" % (r.returncode, r.stderr.strip()[:600])
    P = [a.astype(np.float64) for _, _, a in c.params]
    details, ok_all = [], True
    # the forward loss
    loss = np.load(os.path.join(d, "out", "loss.npy")).astype(np.float64)
    lref = c.loss_ref(P)
    if not np.isfinite(loss) or abs(loss - lref) > LOSS_RTOL * (1.0 + c.loss_mag(P)):
        ok_all = False
        details.append("loss %.9g, expected %.9g" % (loss, lref))
    for i, (pn, shape, _) in enumerate(c.params):
        path = os.path.join(d, "out", "grad.%s.npy" % pn)
        if not os.path.exists(path):
            return False, "missing output grad.%s" % pn
        got = np.load(path)
        if got.shape != shape or got.dtype != np.float32:
            ok_all = False
            details.append("%s: %s %s, expected %s float32" % (pn, got.dtype, got.shape, shape))
            continue
        got = got.astype(np.float64)
        if not np.all(np.isfinite(got)):
            ok_all = False
            details.append("%s: %d non-finite elements" % (pn, int(np.sum(~np.isfinite(got)))))
            continue
        if pn in c.expect_fn:
            exp = np.asarray(c.expect_fn[pn](), dtype=np.float64)
            err = np.abs(got - exp)
            bound = 1e-5 * (1.0 + np.abs(exp))
            if np.any(err > bound):
                k = int(np.argmax(err / bound))
                idx = tuple(int(t) for t in np.unravel_index(k, shape)) if shape else ()
                ok_all = False
                details.append("%s: rule: %d/%d off; at %s got %.8g, expected %.8g" % (
                    pn, int(np.sum(err > bound)), got.size, idx, got.ravel()[k], exp.ravel()[k]))
            else:
                details.append("%s: rule ok (max err %.1e)" % (pn, err.max() if err.size else 0.0))
            continue
        ok, det = fd_check(c, P, i, got)
        ok_all &= ok
        details.append("%s: %s" % (pn, det))
    return ok_all, "; ".join(details)


def main():
    return harness.main("check_grads", __doc__, CASES, run_case, "dlopt-check-grads-",
                        "case.mlir, params and outputs of each case", exc_filename=True)


if __name__ == "__main__":
    sys.exit(main())
