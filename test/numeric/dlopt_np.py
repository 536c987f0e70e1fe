"""Shared helpers of the numeric suites: tool lookup, dtypes, .npy storage
and the tolerance check against a NumPy float64 reference.

Backend-agnostic: nothing here knows how an op is implemented; the suites
only build MLIR text, run dlopt-compile / dlopt-run and compare outputs.
"""
import os
import shutil
import subprocess

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def find_tool(name, bin_dir=None):
    """bin_dir, then PATH (lit puts build/bin first), then <repo>/build/bin."""
    if bin_dir:
        return os.path.join(bin_dir, name)
    found = shutil.which(name)
    if found:
        return found
    cand = os.path.join(REPO, "build", "bin", name)
    if os.path.exists(cand):
        return cand
    raise SystemExit("cannot find %s: put it on PATH or pass --bin-dir" % name)


# ---------------------------------------------------------------- dtypes

FLOATS = ("f32", "f16", "bf16")
INTS = ("i32", "i64")

# Relative error bound per result element type: a float result passes when
# |got - ref| <= TOL[dtype] * scale * (1 + mag), where mag is |ref| unless the
# case supplies a magnitude (sum of |terms| for sums, |a|@|b| for matmul...).
# Ints and i1 must match exactly.
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 2e-2}


def bf16_round(x):
    """float32 -> nearest bf16 value (round to nearest even), as float32."""
    x = np.array(x, dtype=np.float32, order="C")
    b = x.view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = r.view(np.float32).reshape(x.shape)
    return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)


def store(data, dt):
    """Array as dlopt-run reads it for element type dt (bf16 as exact f32)."""
    # np.array (not ascontiguousarray, which makes 0-d arrays 1-d) copies in C order
    if dt == "bf16":
        return bf16_round(np.array(data, dtype=np.float32))
    types = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64, "i1": np.bool_}
    return np.array(data, dtype=types[dt], order="C")


def as_ref(stored, dt):
    """The exact value of a stored array in the reference's types."""
    if dt in FLOATS:
        return stored.astype(np.float64)
    if dt in INTS:
        return stored.astype(np.int64)
    return stored.astype(np.bool_)


def ttype(shape, dt):
    return "tensor<" + "".join("%dx" % d for d in shape) + dt + ">"


def fmt_f(v):
    """An MLIR float literal (always with a '.')."""
    s = repr(float(v))
    if "e" in s and "." not in s:
        s = s.replace("e", ".0e")
    elif "." not in s and "e" not in s:
        s += ".0"
    return s


def compare(got, ref, dt, mag=None, scale=1.0):
    """Returns (ok, detail). NaN in `got` passes only where `ref` is NaN."""
    ref = np.asarray(ref)
    if got.shape != ref.shape:
        return False, "shape %s, expected %s" % (got.shape, ref.shape)
    if dt in INTS or dt == "i1":
        if dt == "i1" and got.dtype != np.bool_:
            return False, "dtype %s, expected bool" % got.dtype
        g = got.astype(np.int64)
        r = ref.astype(np.int64)
        bad = np.flatnonzero(g.ravel() != r.ravel())
        if bad.size:
            i = bad[0]
            idx = np.unravel_index(i, ref.shape) if ref.shape else ()
            return False, "%d/%d elements differ; first at %s: got %d, expected %d" % (
                bad.size, r.size, tuple(int(t) for t in idx), g.ravel()[i], r.ravel()[i])
        return True, "exact"
    g = got.astype(np.float64).ravel()
    r = ref.astype(np.float64).ravel()
    m = np.abs(r) if mag is None else np.asarray(mag, np.float64).ravel() * np.ones_like(r)
    tol = TOL[dt] * scale
    gnan, rnan = np.isnan(g), np.isnan(r)
    if np.any(gnan & ~rnan):
        i = np.flatnonzero(gnan & ~rnan)[0]
        return False, "NaN at flat index %d (%d NaNs), expected %.9g" % (
            i, int(np.sum(gnan & ~rnan)), r[i])
    if np.any(rnan & ~gnan):
        i = np.flatnonzero(rnan & ~gnan)[0]
        return False, "expected NaN at flat index %d, got %.9g" % (i, g[i])
    fin = ~rnan
    rinf = np.isinf(r)
    if np.any(rinf & (g != r)):
        i = np.flatnonzero(rinf & (g != r))[0]
        return False, "flat index %d: got %.9g, expected %.9g" % (i, g[i], r[i])
    fin &= ~rinf
    if not np.any(fin):
        return True, "all NaN/Inf as expected"
    if scale == 0.0:    # an exact (data movement / rounding) result
        bad = np.flatnonzero(fin & (g != r))
        if bad.size:
            i = bad[0]
            return False, "%d/%d elements differ (exact expected); first at flat index %d: got %.9g, expected %.9g" % (
                bad.size, r.size, i, g[i], r[i])
        return True, "exact"
    err = np.zeros_like(r)
    err[fin] = np.abs(g[fin] - r[fin])
    bound = tol * (1.0 + np.where(fin, m, 0.0))
    ratio = np.where(fin, err / bound, 0.0)
    if not np.all(np.isfinite(g[fin])):
        i = np.flatnonzero(fin & ~np.isfinite(g))[0]
        return False, "flat index %d: got %.9g, expected %.9g" % (i, g[i], r[i])
    i = int(np.argmax(ratio))
    detail = "max err %.3g (%.3g of bound, tol %.1e)" % (err.max(), ratio[i], tol)
    if ratio[i] > 1.0:
        idx = np.unravel_index(i, ref.shape) if ref.shape else ()
        nbad = int(np.sum(ratio > 1.0))
        return False, "%d/%d elements out of tolerance; worst at %s: got %.9g, expected %.9g; %s" % (
            nbad, r.size, tuple(int(t) for t in idx), g[i], r[i], detail)
    return True, detail


DROPOUT_OFFSET_MUL = 0xD1B54A32D192ED03


def dropout_seed(seed, offset=0):
    """The effective dropout seed of docs/ops.md, seed + offset * 0xD1B54A32D192ED03
    in uint64 (wrapping; a negative seed or offset is taken in two's complement)."""
    return (int(seed) + int(offset) * DROPOUT_OFFSET_MUL) % 2 ** 64


def dropout_u(seed, n, offset=0):
    """u(s, i) of docs/ops.md for i in [0, n), in uint64 arithmetic, where
    s = dropout_seed(seed, offset) (offset 0: s = seed)."""
    U64 = np.uint64
    i = np.arange(n, dtype=U64)
    with np.errstate(over="ignore"):
        z = U64(dropout_seed(seed, offset)) + (i + U64(1)) * U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
        z = z ^ (z >> U64(31))
    return (z >> U64(40)).astype(np.float64) * 2.0 ** -24


def run(cmd, timeout=120):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)
