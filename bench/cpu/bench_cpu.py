#!/usr/bin/env python3
"""dlopt's CPU backend against PyTorch eager on the CPU, side by side.

For every case (the models of issue 15: gpt tiny/small/gpt2-small, llama
tiny/small, the mlp, the cnn at batch 4 and 64, resnet18 at 64 px) and every
thread count, the script times:

  train    one training step: forward, mean cross entropy, backward, AdamW
           (weight decay 0.01, no clipping), f32;
  forward  the forward pass and the loss, without gradients.

dlopt runs as `dlopt-run` on plans from `dlopt-gen` + `dlopt-compile`
(--train for the step); PyTorch runs the same architecture written in
torch.nn (the idiomatic eager model a user would write: fused qkv, a causal
mask, nn.Conv2d/BatchNorm2d). Each measurement is its own process; the two
frameworks alternate (dlopt, torch, dlopt, torch, ...) so that a noisy
neighbour hits both. Start-up and parameter initialization are excluded,
and so is the first (warm-up) training step or PyTorch forward. Both train
on the same fixed arrays (dlopt through --data-input, a one-batch dataset);
dlopt's
forward figure is the median of its `--repeat` runs, warm-up included. PyTorch runs with OMP_WAIT_POLICY=PASSIVE (its
fastest setting here), torch.set_num_threads(T) and OPENBLAS_NUM_THREADS=T
(Debian's torch calls OpenBLAS, which torch.set_num_threads does not limit:
without it "one thread" ran every GEMM on two); dlopt with --threads T.

Prints one row per case, mode and thread count: the median time per step
or forward of each framework, their ratio (dlopt / torch: below 1 means
dlopt is faster), and each process's peak resident memory. --json appends
the rows as JSON lines. Not a test: nothing fails on a slow figure.

  bench/cpu/bench_cpu.py [--cases gpt-small,cnn-b64] [--threads 1,2]
                         [--modes train,forward] [--rounds 2] [--json F]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name: (family, dims, steps per process, forward repeats per process)
CASES = {
    "gpt-tiny": ("gpt", dict(layers=2, hidden=64, heads=4, ffn=256, seq=16, vocab=128, batch=2), 30, 50),
    "gpt-small": ("gpt", dict(layers=4, hidden=256, heads=4, ffn=1024, seq=128, vocab=8192, batch=4), 6, 10),
    "gpt2-small": ("gpt", dict(layers=12, hidden=768, heads=12, ffn=3072, seq=256, vocab=50257, batch=1), 3, 4),
    "llama-tiny": ("llama", dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=192, seq=16, vocab=128, batch=2), 30, 50),
    "llama-small": ("llama", dict(layers=4, hidden=256, heads=4, kv_heads=2, ffn=768, seq=128, vocab=8192, batch=4), 6, 10),
    "mlp": ("mlp", dict(inp=784, hidden=256, layers=2, classes=10, batch=32), 30, 50),
    "cnn-b4": ("cnn", dict(width=16, image=28, channels=1, classes=10, batch=4), 30, 50),
    "cnn-b64": ("cnn", dict(width=16, image=28, channels=1, classes=10, batch=64), 8, 15),
    "resnet18-64px": ("resnet", dict(width=64, image=64, channels=3, classes=1000, batch=8), 4, 6),
}


def gen_args(family, d):
    """dlopt-gen arguments that build the case's model."""
    if family in ("gpt", "llama"):
        a = [family, "--layers", d["layers"], "--hidden", d["hidden"], "--heads", d["heads"],
             "--ffn", d["ffn"], "--seq", d["seq"], "--vocab", d["vocab"], "--batch", d["batch"]]
        if family == "gpt":
            a = ["gpt", "--preset", "gpt-tiny"] + a[1:]
        else:
            a = ["llama", "--preset", "llama-tiny"] + a[1:] + ["--kv-heads", d["kv_heads"]]
        return [str(x) for x in a]
    if family == "mlp":
        return [str(x) for x in ["mlp", "--preset", "mlp-small", "--in", d["inp"], "--hidden", d["hidden"],
                                 "--layers", d["layers"], "--classes", d["classes"], "--batch", d["batch"]]]
    if family == "cnn":
        return [str(x) for x in ["cnn", "--preset", "cnn-small", "--width", d["width"], "--image-size", d["image"],
                                 "--channels", d["channels"], "--classes", d["classes"], "--batch", d["batch"]]]
    return [str(x) for x in ["resnet", "--preset", "resnet18", "--width", d["width"], "--image-size", d["image"],
                             "--channels", d["channels"], "--classes", d["classes"], "--batch", d["batch"]]]


def inputs_of(family, d, seed=0):
    """The forward pass's inputs as numpy arrays (name -> array)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    if family in ("gpt", "llama"):
        shape = (d["batch"], d["seq"])
        return {"tokens": rng.integers(0, d["vocab"], shape, dtype=np.int32),
                "labels": rng.integers(0, d["vocab"], shape, dtype=np.int32)}
    if family == "mlp":
        return {"x": rng.standard_normal((d["batch"], d["inp"]), dtype=np.float32),
                "labels": rng.integers(0, d["classes"], (d["batch"],), dtype=np.int32)}
    return {"images": rng.standard_normal((d["batch"], d["channels"], d["image"], d["image"]), dtype=np.float32),
            "labels": rng.integers(0, d["classes"], (d["batch"],), dtype=np.int32)}


# ---------------------------------------------------------------- PyTorch

def torch_model(torch, family, d):
    nn, F = torch.nn, torch.nn.functional

    if family in ("gpt", "llama"):
        L, h, H, S, V = d["layers"], d["hidden"], d["heads"], d["seq"], d["vocab"]
        G = d.get("kv_heads", H)
        Dh = h // H
        mask = torch.ones(S, S, dtype=torch.bool).tril()

        def attend(q, k, v):  # [B, H, S, Dh], causal, as in nanoGPT (torch 1.13)
            att = (q @ k.transpose(-2, -1)) * (1.0 / Dh ** 0.5)
            att = att.masked_fill(~mask, float("-inf"))
            return F.softmax(att, dim=-1) @ v

        class RMSNorm(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(h))

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

        inv = 1.0 / (10000.0 ** (torch.arange(0, Dh, 2).float() / Dh))
        ang = torch.outer(torch.arange(S).float(), inv)
        cos, sin = ang.cos(), ang.sin()

        def rope(x):  # [B, H, S, Dh], rotate pairs (x[2i], x[2i+1])
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                llama = family == "llama"
                self.ln1 = RMSNorm() if llama else nn.LayerNorm(h)
                self.ln2 = RMSNorm() if llama else nn.LayerNorm(h)
                self.qkv = nn.Linear(h, (H + 2 * G) * Dh, bias=not llama)
                self.proj = nn.Linear(h, h, bias=not llama)
                if llama:
                    self.gate_up = nn.Linear(h, 2 * d["ffn"], bias=False)
                    self.down = nn.Linear(d["ffn"], h, bias=False)
                else:
                    self.fc1 = nn.Linear(h, d["ffn"])
                    self.fc2 = nn.Linear(d["ffn"], h)

            def forward(self, x):
                B = x.shape[0]
                q, k, v = self.qkv(self.ln1(x)).split([H * Dh, G * Dh, G * Dh], dim=2)
                q = q.view(B, S, H, Dh).transpose(1, 2)
                k = k.view(B, S, G, Dh).transpose(1, 2)
                v = v.view(B, S, G, Dh).transpose(1, 2)
                if family == "llama":
                    q, k = rope(q), rope(k)
                    if G != H:
                        k = k.repeat_interleave(H // G, dim=1)
                        v = v.repeat_interleave(H // G, dim=1)
                y = attend(q, k, v).transpose(1, 2).reshape(B, S, h)
                x = x + self.proj(y)
                m = self.ln2(x)
                if family == "llama":
                    g, u = self.gate_up(m).chunk(2, dim=-1)
                    return x + self.down(F.silu(g) * u)
                return x + self.fc2(F.gelu(self.fc1(m), approximate="tanh"))

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.wte = nn.Embedding(V, h)
                self.wpe = nn.Embedding(S, h) if family == "gpt" else None
                self.blocks = nn.ModuleList(Block() for _ in range(L))
                self.lnf = RMSNorm() if family == "llama" else nn.LayerNorm(h)
                self.head = nn.Linear(h, V, bias=False) if family == "llama" else None

            def forward(self, tokens, labels):
                x = self.wte(tokens)
                if self.wpe is not None:
                    x = x + self.wpe.weight
                for b in self.blocks:
                    x = b(x)
                x = self.lnf(x)
                logits = self.head(x) if self.head is not None else x @ self.wte.weight.t()
                return F.cross_entropy(logits.view(-1, V), labels.view(-1).long())
        return LM()

    if family == "mlp":
        layers, sizes = [], [d["inp"]] + [d["hidden"]] * d["layers"]
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        body = nn.Sequential(*layers, nn.Linear(sizes[-1], d["classes"]))

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = body

            def forward(self, x, labels):
                return F.cross_entropy(self.body(x), labels.long())
        return MLP()

    if family == "cnn":
        W = d["width"]
        body = nn.Sequential(
            nn.Conv2d(d["channels"], W, 3, padding=1, bias=False), nn.BatchNorm2d(W), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(W, 2 * W, 3, padding=1, bias=False), nn.BatchNorm2d(2 * W), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * W * (d["image"] // 4) ** 2, d["classes"]))
    else:  # resnet18 (v1.5, basic blocks)
        class Basic(nn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.b1 = nn.BatchNorm2d(cout)
                self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.b2 = nn.BatchNorm2d(cout)
                self.down = None
                if stride != 1 or cin != cout:
                    self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

            def forward(self, x):
                y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
                return F.relu(y + (x if self.down is None else self.down(x)))

        W, blocks, cin = d["width"], [], d["width"]
        for stage in range(4):
            cout = W * 2 ** stage
            for b in range(2):
                blocks.append(Basic(cin, cout, 2 if (stage > 0 and b == 0) else 1))
                cin = cout
        body = nn.Sequential(
            nn.Conv2d(d["channels"], W, 7, 2, 3, bias=False), nn.BatchNorm2d(W), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1), *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, d["classes"]))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = body

        def forward(self, images, labels):
            return F.cross_entropy(self.body(images), labels.long())
    return Net()


def torch_worker(args):
    """One PyTorch process: prints {"times": [...]} (seconds per step/forward)."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    family, d, steps, repeats = CASES[args.case]
    model = torch_model(torch, family, d)
    model.train()  # batch norm in training mode, as dlopt's forward plans
    feeds = [torch.from_numpy(a) for a in inputs_of(family, d).values()]
    times = []
    if args.mode == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            loss = model(*feeds)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
    else:
        with torch.no_grad():
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                model(*feeds)
                times.append(time.perf_counter() - t0)
    print(json.dumps({"times": times[1:]}))


# ------------------------------------------------------------------ dlopt

def prepare_dlopt(bin_dir, work, case):
    """Generates and compiles the case's forward and training plans once."""
    family, d, _, _ = CASES[case]
    mlir = os.path.join(work, case + ".mlir")
    subprocess.run([os.path.join(bin_dir, "dlopt-gen")] + gen_args(family, d) + ["-q", "-o", mlir], check=True)
    plans = {}
    for mode, extra in (("train", ["--train"]), ("forward", [])):
        plan = os.path.join(work, f"{case}.{mode}.plan")
        subprocess.run([os.path.join(bin_dir, "dlopt-compile"), mlir, "-o", plan, "--quiet"] + extra, check=True)
        plans[mode] = plan
    import numpy as np
    feeds = []
    for name, a in inputs_of(family, d).items():
        path = os.path.join(work, f"{case}.{name}.npy")
        np.save(path, a)
        feeds += ["--input", f"{name}={path}"]
    return plans, feeds


def run_measured(cmd, env, out_path):
    """Runs cmd; returns (stdout text, peak RSS in MiB). The peak comes from
    /usr/bin/time: a child forked from this (numpy-sized) Python process
    would report the parent's pages in its own ru_maxrss."""
    rss_path = out_path + ".rss"
    with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
        rc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_path] + cmd,
                            stdout=out, stderr=err, env=env).returncode
    text = open(out_path).read()
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({rc}): {open(out_path + '.err').read()[-2000:]}")
    return text, float(open(rss_path).read().split()[-1]) / 1024.0


def time_dlopt(bin_dir, work, case, mode, threads, plans, feeds):
    _, _, steps, repeats = CASES[case]
    run = os.path.join(bin_dir, "dlopt-run")
    out = os.path.join(work, "dlopt.out")
    if mode == "train":
        metrics = os.path.join(work, "m.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        # The same arrays PyTorch trains on, as a one-batch dataset: the
        # step binds a copy of them, where synthetic data (dlopt-run's
        # default) would draw fresh normal samples every step, which
        # PyTorch's loop does not pay for.
        data = [a.replace("--input", "--data-input") for a in feeds]
        _, rss = run_measured([run, plans["train"], "--steps", str(steps + 1), "--threads", str(threads),
                               "--metrics", metrics, "--log-every", str(steps + 1)] + data,
                              os.environ, out)
        rows = [json.loads(l) for l in open(metrics)]
        return [r["step_time_s"] for r in rows[1:]], rss
    text, rss = run_measured([run, plans["forward"], "--repeat", str(repeats + 1), "--threads", str(threads)]
                             + feeds, os.environ, out)
    for line in text.splitlines():
        if line.startswith("time: median"):
            return [float(line.split()[2]) / 1e3], rss
    raise RuntimeError("no time line in dlopt-run's output:\n" + text)


def time_torch(work, case, mode, threads):
    # OPENBLAS_NUM_THREADS: torch.set_num_threads does not reach the BLAS
    # behind Debian's torch (OpenBLAS through libblas), which would otherwise
    # run every GEMM on all cores.
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    text, rss = run_measured([sys.executable, os.path.abspath(__file__), "--torch-worker", case, "--mode", mode,
                              "--threads", str(threads)], env, os.path.join(work, "torch.out"))
    return json.loads(text.strip().splitlines()[-1])["times"], rss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--modes", default="train,forward")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two frameworks")
    ap.add_argument("--build", default=os.path.join(ROOT, os.environ.get("BUILD_DIR", "build")))
    ap.add_argument("--json", help="append the rows here (JSON lines)")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        args.case = args.torch_worker
        args.threads = int(args.threads)
        return torch_worker(args)
    if not os.access("/usr/bin/time", os.X_OK):
        print("bench_cpu.py: needs /usr/bin/time (apt-get install time) for peak memory", file=sys.stderr)
        return 77
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_cpu.py: PyTorch is not installed (apt-get install python3-torch)", file=sys.stderr)
        return 77
    bin_dir = os.path.join(args.build, "bin")
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case '{c}' (cases: {', '.join(CASES)})")
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    print(f"# {os.cpu_count()} cores, {cpu}; torch {torch.__version__}; medians of {args.rounds} alternations")
    print(f"{'case':<15}{'mode':<9}{'thr':>4}{'dlopt ms':>11}{'torch ms':>11}{'ratio':>8}{'dlopt MiB':>11}{'torch MiB':>11}")
    with tempfile.TemporaryDirectory() as work:
        for case in cases:
            plans, feeds = prepare_dlopt(bin_dir, work, case)
            for mode in args.modes.split(","):
                for threads in [int(t) for t in args.threads.split(",")]:
                    dt, tt, drss, trss = [], [], 0.0, 0.0
                    for _ in range(args.rounds):
                        t, r = time_dlopt(bin_dir, work, case, mode, threads, plans, feeds)
                        dt += t
                        drss = max(drss, r)
                        t, r = time_torch(work, case, mode, threads)
                        tt += t
                        trss = max(trss, r)
                    d, t = statistics.median(dt), statistics.median(tt)
                    row = {"case": case, "mode": mode, "threads": threads, "dlopt_s": d, "torch_s": t,
                           "ratio": d / t, "dlopt_rss_mib": drss, "torch_rss_mib": trss}
                    print(f"{case:<15}{mode:<9}{threads:>4}{d * 1e3:>11.2f}{t * 1e3:>11.2f}{d / t:>8.2f}"
                          f"{drss:>11.0f}{trss:>11.0f}", flush=True)
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
