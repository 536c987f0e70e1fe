#!/usr/bin/env python3
"""PyTorch baseline for the GPU training-step benchmark (scripts/bench-gpu.sh).

A GPT with the dims of dlopt-gen's presets (pre-LayerNorm blocks, learned
positions, GELU MLP, LM head tied to the token embedding, causal attention
through scaled_dot_product_attention), one training step = forward, mean
cross entropy, backward, AdamW (fused when available), in bf16 autocast with
fp32 master weights. Reports, per mode (eager, torch.compile), the median
step time, tokens/s, MFU against the measured bf16 GEMM rate and against the
datasheet peak, and peak allocated memory, as one JSON object per line.

  torch_gpt.py --model gpt2-small --batch 8 [--modes eager,compile]
               [--steps 10] [--warmup 3] [--json OUT.jsonl]
  torch_gpt.py --gemm-only      # just the bf16 GEMM ceiling

Status: written without a GPU; it has not run yet.
"""
import argparse
import json
import math
import statistics
import sys
import time

PRESETS = {  # layers, hidden, heads, seq, vocab (docs/dlopt-gen.md)
    "gpt-tiny": (2, 64, 4, 16, 128),
    "gpt2-small": (12, 768, 12, 1024, 50257),
    "gpt2-medium": (24, 1024, 16, 1024, 50257),
    "gpt2-large": (36, 1280, 20, 1024, 50257),
    "gpt2-xl": (48, 1600, 25, 1024, 50257),
    "gpt3-1.3b": (24, 2048, 16, 2048, 50257),
}
# Dense bf16 datasheet peaks (TFLOP/s), /work/shared/design.md.
PEAK_BF16 = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def gemm_rate(torch, n=8192, iters=20):
    """Measured bf16 GEMM TFLOP/s on an n x n x n product: the ceiling."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2.0 * n ** 3 * iters / (time.perf_counter() - t0) / 1e12


def build(torch, layers, hidden, heads, seq, vocab):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(hidden, dim=2)
            q, k, v = (t.view(b, s, heads, hidden // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, hidden))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(hidden)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, tokens, labels):
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.wte(tokens) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # tied LM head
            return F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))

    return GPT()


def step_flops(layers, hidden, seq, vocab, params, tokens):
    """Model FLOPs of a training step: 6 N per token for the weights plus
    causal attention (12 L s h per token fwd+bwd, halved for causal)."""
    return 6.0 * params * tokens + 6.0 * layers * seq * hidden * tokens


def bench_mode(torch, args, mode, dims, ceiling, peak):
    layers, hidden, heads, seq, vocab = dims
    torch.manual_seed(0)
    model = build(torch, layers, hidden, heads, seq, vocab).cuda()
    params = sum(p.numel() for p in model.parameters())
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    fwd = torch.compile(model) if mode == "compile" else model
    tokens = torch.randint(0, vocab, (args.batch, seq), device="cuda")
    labels = torch.randint(0, vocab, (args.batch, seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tokens, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    ntok = args.batch * seq
    flops = step_flops(layers, hidden, seq, vocab, params, ntok)
    return {
        "framework": "pytorch", "mode": mode, "model": args.model, "batch": args.batch,
        "seq": seq, "params": params, "step_time_s": t, "tokens_per_s": ntok / t,
        "model_tflops": flops / t / 1e12,
        "mfu_vs_gemm": flops / t / 1e12 / ceiling if ceiling else None,
        "mfu_vs_peak": flops / t / 1e12 / peak if peak else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "loss": float(loss), "torch": torch.__version__,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-small", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="append results here (JSON lines)")
    ap.add_argument("--gemm-only", action="store_true")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_gpt.py: PyTorch is not installed", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("torch_gpt.py: no CUDA device", file=sys.stderr)
        return 77
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    ceiling = gemm_rate(torch)
    rows = [{"framework": "gemm", "device": name, "bf16_gemm_tflops": ceiling,
             "datasheet_bf16_tflops": peak}]
    if not args.gemm_only:
        for mode in args.modes.split(","):
            try:
                rows.append(bench_mode(torch, args, mode, PRESETS[args.model], ceiling, peak))
            except RuntimeError as e:  # e.g. out of memory at this batch
                rows.append({"framework": "pytorch", "mode": mode, "model": args.model,
                             "batch": args.batch, "error": str(e).splitlines()[0]})
            torch.cuda.empty_cache()
    for r in rows:
        print(json.dumps(r))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
