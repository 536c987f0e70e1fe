"""Shared helpers of the training suites (check_optimizers.py,
check_training.py): NumPy float64 references of the optimizers and
learning-rate schedules of `dlopt-compile --train`, written from their
published update equations (PyTorch's torch.optim.SGD, Adam and AdamW
documentation; torch.nn.utils.clip_grad_norm_), and a safetensors reader.

Schedule convention (passes/Optimizer.cpp, dlopt-compile --help): step t is
1-based (the value of the `step` state after the update); linear warmup
lr = peak * t / W for t <= W, then constant peak, or a cosine / linear decay
from peak to min-lr over t in [W, total], min-lr after total:

    p = clamp((t - W) / (total - W), 0, 1)
    cosine: lr = min + (peak - min) * (1 + cos(pi p)) / 2
    linear: lr = min + (peak - min) * (1 - p)
"""
import json
import math
import struct

import numpy as np


class OptConfig:
    def __init__(self, optimizer="adamw", lr=1e-3, momentum=0.0, nesterov=False,
                 weight_decay=None, beta1=0.9, beta2=0.999, eps=1e-8,
                 schedule="constant", warmup=0, total=0, min_lr=0.0, clip=0.0):
        self.optimizer = optimizer
        self.lr = lr
        self.momentum = momentum
        self.nesterov = nesterov
        # dlopt's default: 0.01 for adamw (as PyTorch's AdamW), 0 otherwise
        self.wd_given = weight_decay
        self.wd = (0.01 if optimizer == "adamw" else 0.0) if weight_decay is None else weight_decay
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.schedule, self.warmup, self.total, self.min_lr = schedule, warmup, total, min_lr
        self.clip = clip

    def flags(self):
        f = ["--optimizer", self.optimizer, "--lr", repr(self.lr)]
        if self.momentum:
            f += ["--momentum", repr(self.momentum)]
        if self.nesterov:
            f += ["--nesterov"]
        if self.wd_given is not None:
            f += ["--weight-decay", repr(self.wd_given)]
        if self.optimizer != "sgd":
            if self.beta1 != 0.9:
                f += ["--beta1", repr(self.beta1)]
            if self.beta2 != 0.999:
                f += ["--beta2", repr(self.beta2)]
            if self.eps != 1e-8:
                f += ["--adam-eps", repr(self.eps)]
        if self.schedule != "constant":
            f += ["--schedule", self.schedule, "--total-steps", str(self.total)]
        if self.warmup:
            f += ["--warmup-steps", str(self.warmup)]
        if self.min_lr:
            f += ["--min-lr", repr(self.min_lr)]
        if self.clip:
            f += ["--clip-norm", repr(self.clip)]
        return f

    def state_names(self, param):
        if self.optimizer == "sgd":
            return ["sgd.momentum." + param] if self.momentum else []
        return ["%s.m.%s" % (self.optimizer, param), "%s.v.%s" % (self.optimizer, param)]


def lr_at(cfg, t):
    """Learning rate of (1-based) step t."""
    if cfg.warmup > 0 and t <= cfg.warmup:
        return cfg.lr * t / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    p = min(max((t - cfg.warmup) / float(cfg.total - cfg.warmup), 0.0), 1.0)
    frac = 0.5 * (1.0 + math.cos(math.pi * p)) if cfg.schedule == "cosine" else 1.0 - p
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * frac


def opt_step(cfg, params, grads, state, t):
    """One update. params/grads: dict name -> float64 array; state: dict
    state name -> array (missing = zeros). Returns (new params, new state,
    lr, grad_norm) without modifying the arguments."""
    lr = lr_at(cfg, t)
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    coef = min(1.0, cfg.clip / (norm + 1e-6)) if cfg.clip > 0 else 1.0   # clip_grad_norm_
    newp, news = {}, dict(state)
    for n, p in params.items():
        g = grads[n] * coef
        if cfg.optimizer == "sgd":
            if cfg.wd:
                g = g + cfg.wd * p
            if cfg.momentum:
                k = "sgd.momentum." + n
                buf = cfg.momentum * state.get(k, np.zeros_like(p)) + g   # dampening 0
                news[k] = buf
                g = g + cfg.momentum * buf if cfg.nesterov else buf
            newp[n] = p - lr * g
        else:
            if cfg.optimizer == "adam" and cfg.wd:
                g = g + cfg.wd * p                                        # L2 (coupled)
            km, kv = "%s.m.%s" % (cfg.optimizer, n), "%s.v.%s" % (cfg.optimizer, n)
            m = cfg.beta1 * state.get(km, np.zeros_like(p)) + (1 - cfg.beta1) * g
            v = cfg.beta2 * state.get(kv, np.zeros_like(p)) + (1 - cfg.beta2) * g * g
            news[km], news[kv] = m, v
            mhat = m / (1 - cfg.beta1 ** t)
            vhat = v / (1 - cfg.beta2 ** t)
            q = p
            if cfg.optimizer == "adamw" and cfg.wd:
                q = p * (1 - lr * cfg.wd)                                 # decoupled decay
            newp[n] = q - lr * mhat / (np.sqrt(vhat) + cfg.eps)
    news["step"] = t
    return newp, news, lr, norm


SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64,
                      "BOOL": np.bool_, "U8": np.uint8, "F64": np.float64, "BF16": None}


def read_safetensors(path):
    """Returns (tensors: dict name -> array, metadata: dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        dt = info["dtype"]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(SAFETENSORS_DTYPES[dt]).newbyteorder("<"))
        out[name] = arr.reshape(info["shape"]).copy()
    return out, meta


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]
