#!/usr/bin/env python3
"""Seed corpora for the libFuzzer targets (docs/testing.md, "Fuzzing").

Two kinds of seeds:

  collect OUT      seeds taken from the repository's own files at run time,
                   so they follow the tests and docs: lit inputs split at
                   `// -----` (mlir), cluster files and the YAML/JSON
                   examples of docs/cluster.md, the bundled .npy data,
                   --fix values used by the tests; plus the MLIR dictionary
                   (every dlopt op mnemonic of DLOptOps.td) and regression
                   inputs (OUT/regress/TARGET: deep JSON/YAML, an alias
                   bomb, overflowing .npy shapes), which scripts/fuzz.sh
                   runs whole. scripts/fuzz.sh calls this before each run.

  regenerate BIN   rewrites the committed seeds of test/fuzz/corpus/ that
                   need dlopt's tools to make (plan files, checkpoints, plan
                   JSON, cluster JSON) or NumPy (.npy, safetensors); BIN is
                   the bin/ folder of a normal build. Run it by hand when a
                   format changes, and commit the result.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "test", "fuzz", "corpus")


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(path, "wb") as f:
        f.write(data)


def files_under(top, suffixes):
    for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
        for n in sorted(names):
            if n.endswith(suffixes):
                yield os.path.join(dirpath, n)


def doc_blocks(doc, lang):
    text = open(os.path.join(ROOT, "docs", doc)).read()
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


def collect(out):
    # MLIR: every case of the dialect, pass and tool lit tests.
    n = 0
    for top in ("test/Dialect", "test/Passes", "test/tools"):
        for path in files_under(top, (".mlir",)):
            for case in re.split(r"^// -----\s*$", open(path).read(), flags=re.M):
                if case.strip():
                    write(os.path.join(out, "mlir", "lit-%04d" % n), case)
                    n += 1
    td = open(os.path.join(ROOT, "dialects/DLOpt/IR/DLOptOps.td")).read()
    ops = sorted(set(re.findall(r'def DLOpt_\w+\s*:\s*\w+<"([a-z0-9_]+)"', td)))
    words = ["dlopt." + o for o in ops] + [
        "func.func", "func.return", "return", "arith.constant", "tensor<",
        "f32", "bf16", "f16", "i64", "i32", "i1", "dense<", "dlopt.param",
        "dlopt.input", "dlopt.output", "dlopt.loss", "dlopt.init", "dlopt.layer",
        "{", "}", "(", ")", "[", "]", "->", ":", "%", "@main", "x", "-1"]
    write(os.path.join(out, "mlir.dict"),
          "".join('"%s"\n' % w.replace('"', '\\"') for w in words))

    # Cluster files: test inputs and the documented examples (JSON is YAML).
    for i, path in enumerate(files_under("test/tools", (".yaml", ".yml"))):
        write(os.path.join(out, "cluster-yaml", "test-%d.yaml" % i), open(path).read())
    for i, block in enumerate(doc_blocks("cluster.md", "yaml")):
        write(os.path.join(out, "cluster-yaml", "doc-%d.yaml" % i), block)
    for i, block in enumerate(doc_blocks("cluster.md", "json")):
        write(os.path.join(out, "cluster-json", "doc-%d.json" % i), block)
        write(os.path.join(out, "cluster-yaml", "doc-json-%d.yaml" % i), block)

    # .npy files, also as token files (first byte: raw dtype, see the target).
    for path in files_under("examples/data", (".npy",)):
        data = open(path, "rb").read()
        name = os.path.basename(path)
        write(os.path.join(out, "npy", name), data)
        write(os.path.join(out, "tokens", name), b"\0" + data)

    # Regressions: inputs of the kinds that crashed readers before they were
    # hardened (recursive JSON/YAML DOMs overflowing the stack at ~40,000
    # levels under ASan, an alias bomb, element counts that overflow).
    # Larger than -max_len, so scripts/fuzz.sh runs them whole, apart.
    reg = os.path.join(out, "regress")
    deep = "[" * 100000 + "]" * 100000
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        "%s: &%s [%s]\n" % (c, c, ", ".join(["*" + p] * 10))
        for p, c in zip("abcdefgh", "bcdefghi"))
    docs = {
        "cluster-json": ['{"name": %s, "nodes": 1}', '{"x": %s}', "%s"],
        "plan": ['{"format": "dlopt-plan", "x": %s}', '{"format": %s}', "%s"],
        "calibration": ['{"attention_efficiency": %s}', "%s"],
        "profile": ['{"format": "dlopt-profile", "instructions": %s}', "%s"],
        "executable": ['\2{"x": %s}', '\2{"values": %s}', "\2%s"],
    }
    docs["cluster-yaml"] = docs["cluster-json"]
    for t, forms in docs.items():
        for i, form in enumerate(forms):
            write(os.path.join(reg, t, "deep-%d" % i), form % deep)
    for i, form in enumerate(['{"__metadata__": {"x": "y"}, "t": %s}',
                              '{"__metadata__": %s}']):
        header = (form % deep).encode()
        for t in ("safetensors", "checkpoint"):
            write(os.path.join(reg, t, "deep-%d" % i),
                  struct.pack("<Q", len(header)) + header)
    write(os.path.join(reg, "cluster-yaml", "deep-block"), "- " * 100000 + "x\n")
    write(os.path.join(reg, "cluster-yaml", "alias-bomb"), bomb)
    write(os.path.join(reg, "npy", "huge-shape"),
          b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, "
          b"'shape': (281474976710656, 281474976710656, 281474976710656), }"
          .ljust(128, b" ")[:127] + b"\n")
    write(os.path.join(reg, "tokens", "huge-shape"),
          b"\0\x93NUMPY\x01\x00v\x00{'descr': '<u2', 'fortran_order': True, "
          b"'shape': (281474976710656, 281474976710656, 281474976710656), }"
          .ljust(129, b" ")[:128] + b"\n")

    # nccl-tests outputs of the dlopt-calibrate tests, with the first
    # byte the target reads (0x3f: no collective named; 0x00: all_reduce
    # by a prefix and by the file name).
    for i, path in enumerate(files_under("test/tools/dlopt-calibrate/Inputs", (".txt",))):
        text = open(path, "rb").read()
        write(os.path.join(out, "nccl-tests", "input-%d" % i), b"\x3f" + text)
        write(os.path.join(out, "nccl-tests", "input-%d-named" % i), b"\0" + text)

    # --fix values of the tool tests.
    fixes = set()
    for path in files_under("test", (".test",)):
        fixes.update(re.findall(r"--fix[= ]([a-z0-9=,_-]+=[a-z0-9=,_-]+)", open(path).read()))
    for i, fix in enumerate(sorted(fixes)):
        write(os.path.join(out, "fix", "test-%d" % i), fix)


def run(cmd, **kw):
    subprocess.run(cmd, check=True, **kw)


def plan_forms(plan):
    """The executable target's framings of a plan file (see its header):
    mode 0 the whole file, 1 the payload, 2 the JSON, NUL, constants."""
    payload = plan[32:]
    (json_len,) = struct.unpack("<Q", payload[:8])
    const = payload[16 + json_len:]
    as_json = b"\2" + payload[8:8 + json_len] + (b"\0" + const if const else b"")
    return b"\0" + plan, b"\1" + payload, as_json


def regenerate(bindir):
    import numpy as np

    tmp = tempfile.mkdtemp()
    gen = lambda *a: run([os.path.join(bindir, "dlopt-gen"), *a, "-q"])
    comp = lambda *a: run([os.path.join(bindir, "dlopt-compile"), *a, "--quiet"])
    for d in ("executable", "safetensors", "checkpoint", "plan", "cluster-json",
              "npy", "tokens", "calibration"):
        shutil.rmtree(os.path.join(CORPUS, d), ignore_errors=True)

    # Plan files: forward and training steps of tiny models (every op family,
    # fused groups, mixed precision); framed as the executable target reads.
    m = lambda n: os.path.join(tmp, n)
    gen("mlp", "--in", "4", "--hidden", "8", "--layers", "1", "--classes", "3",
        "--batch", "2", "-o", m("mlp.mlir"))
    gen("gpt", "--preset", "gpt-tiny", "--layers", "1", "--hidden", "16",
        "--heads", "2", "--seq", "4", "--vocab", "8", "--batch", "2", "-o", m("gpt.mlir"))
    gen("llama", "--preset", "llama-tiny", "--layers", "1", "--hidden", "16",
        "--heads", "2", "--kv-heads", "1", "--seq", "4", "--vocab", "8", "--batch", "1",
        "-o", m("llama.mlir"))
    gen("cnn", "--batch", "1", "--image-size", "8", "--channels", "1", "--width", "2",
        "--classes", "2", "-o", m("cnn.mlir"))
    plans = {
        "small": [os.path.join(ROOT, "test/tools/dlopt-run/Inputs/small.mlir")],
        "mlp": [m("mlp.mlir")],
        "mlp-adamw": [m("mlp.mlir"), "--train", "--optimizer", "adamw", "--clip-norm",
                      "1", "--schedule", "cosine", "--total-steps", "10"],
        "mlp-fp16": [m("mlp.mlir"), "--train", "--precision", "fp16", "--optimizer",
                     "sgd", "--momentum", "0.9"],
        "gpt": [m("gpt.mlir")],
        "llama": [m("llama.mlir")],
        "cnn-adam": [m("cnn.mlir"), "--train", "--optimizer", "adam"],
        # Data parallel (format v3: mesh, groups, all_reduce, layouts).
        "mlp-dp2": [m("mlp.mlir"), "--train", "--cluster", "cpu:1", "--fix", "dp=2"],
        "gpt-grads-dp2": [m("gpt.mlir"), "--autodiff", "--cluster", "cpu:1",
                          "--fix", "dp=2"],
    }
    for name, args in plans.items():
        comp(*args, "-o", m(name + ".plan"))
        whole, payload, as_json = plan_forms(open(m(name + ".plan"), "rb").read())
        write(os.path.join(CORPUS, "executable", name + ".json"), as_json)
        if name in ("small", "mlp-adamw"):
            write(os.path.join(CORPUS, "executable", name + ".plan"), whole)
            write(os.path.join(CORPUS, "executable", name + ".payload"), payload)

    # A checkpoint (params and AdamW state) after one step.
    run([os.path.join(bindir, "dlopt-run"), m("mlp-adamw.plan"), "--steps", "1",
         "--checkpoint-dir", m("ckpt"), "--checkpoint-every", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = open(m("ckpt/step-000001.safetensors"), "rb").read()
    write(os.path.join(CORPUS, "checkpoint", "mlp-adamw-step1.safetensors"), ckpt)
    write(os.path.join(CORPUS, "safetensors", "mlp-adamw-step1.safetensors"), ckpt)

    # safetensors with every dtype, a scalar and an empty tensor.
    def safetensors(tensors, meta):
        header, data = {}, b""
        if meta:
            header["__metadata__"] = meta
        for name, dtype, shape, raw in tensors:
            header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        text = json.dumps(header, separators=(",", ":"))
        text += " " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text.encode() + data
    write(os.path.join(CORPUS, "safetensors", "dtypes.safetensors"), safetensors([
        ("f32", "F32", [2, 2], np.arange(4, dtype="<f4").tobytes()),
        ("f16", "F16", [3], np.arange(3, dtype="<f2").tobytes()),
        ("bf16", "BF16", [2], b"\x80\x3f\x00\x40"),
        ("i32", "I32", [], np.int32(7).tobytes()),
        ("i64", "I64", [1, 2], np.arange(2, dtype="<i8").tobytes()),
        ("bool", "BOOL", [3], b"\0\1\1"),
        ("empty", "F32", [0, 4], b""),
    ], {"format": "pt"}))

    # .npy: every dtype the reader knows, both orders, header versions 1-3.
    npy = lambda name, a, **kw: np.save(os.path.join(CORPUS, "npy", name), a, **kw)
    os.makedirs(os.path.join(CORPUS, "npy"), exist_ok=True)
    npy("f32.npy", np.arange(6, dtype="<f4").reshape(2, 3))
    npy("f16.npy", np.arange(4, dtype="<f2"))
    npy("i32-scalar.npy", np.array(5, dtype="<i4"))
    npy("i64-fortran.npy", np.asfortranarray(np.arange(6, dtype="<i8").reshape(3, 2)))
    npy("bool.npy", np.array([True, False, True]))
    npy("u8.npy", np.array([0, 1, 1], dtype="u1"))
    npy("empty.npy", np.zeros((0, 3), dtype="<f4"))
    with open(os.path.join(CORPUS, "npy", "v2.npy"), "wb") as f:
        np.lib.format.write_array(f, np.arange(3, dtype="<f4"), version=(2, 0))
    with open(os.path.join(CORPUS, "npy", "v3.npy"), "wb") as f:
        np.lib.format.write_array(f, np.arange(3, dtype="<f4"), version=(3, 0))

    # Token files: first byte even = raw u16, odd = raw i32; .npy of ids.
    tok = os.path.join(CORPUS, "tokens")
    os.makedirs(tok, exist_ok=True)
    write(os.path.join(tok, "raw-u16"), b"\0" + np.arange(10, dtype="<u2").tobytes())
    write(os.path.join(tok, "raw-i32"), b"\1" + np.arange(10, dtype="<i4").tobytes())
    for name, a in (("u2-fortran.npy", np.asfortranarray(np.arange(6, dtype="<u2").reshape(2, 3))),
                    ("i8.npy", np.arange(5, dtype="<i8")),
                    ("u1.npy", np.arange(4, dtype="u1"))):
        np.save(m(name), a)
        write(os.path.join(tok, name), b"\0" + open(m(name), "rb").read())

    # Plan JSON (transformer and op-level) and the clusters embedded in them
    # (Cluster::toJson's format).
    gen("gpt", "--preset", "gpt-tiny", "-o", m("gpt-tiny.mlir"))
    hetero = os.path.join(ROOT, "test/tools/dlopt-compile/Inputs/mixed-a100-h100.yaml")
    dry = {
        "gpt-dgx-h100": [m("gpt-tiny.mlir"), "--train", "--cluster", "dgx-h100:1",
                         "--global-batch", "64"],
        "gpt-hetero": [m("gpt-tiny.mlir"), "--train", "--cluster", hetero,
                       "--global-batch", "64", "--fix", "pp=2,tp=1"],
        "gpt-unfused": [m("gpt-tiny.mlir"), "--train", "--cluster", "dgx-a100:1",
                        "--global-batch", "64", "--attention-kernel", "unfused"],
        "mlp-ops": [m("mlp.mlir"), "--train", "--cluster", "dgx-a100:1"],
        "cnn-ops": [m("cnn.mlir"), "--train", "--cluster", "cpu"],
    }
    for name, args in dry.items():
        out = subprocess.run([os.path.join(bindir, "dlopt-compile"), *args, "--dry-run",
                              "--format", "json"], check=True, capture_output=True).stdout
        plan = json.loads(out)
        # Compact: the same document in fewer bytes, so mutations go further.
        write(os.path.join(CORPUS, "plan", name + ".json"),
              json.dumps(plan, separators=(",", ":")))
        cluster = plan["cluster"]["definition"]
        write(os.path.join(CORPUS, "cluster-json", name + ".json"),
              json.dumps(cluster, indent=1))

    # A calibration file setting every documented key to its default.
    doc = open(os.path.join(ROOT, "docs", "cost-model.md")).read()
    keys = re.findall(r"^\| `([a-z0-9_]+)` \| ([0-9.e]+) \|", doc, re.M)
    write(os.path.join(CORPUS, "calibration", "defaults.json"),
          json.dumps({k: float(v) for k, v in keys}, indent=1))
    write(os.path.join(CORPUS, "calibration", "some.json"),
          '{"matmul_large_efficiency": 0.7, "kernel_launch_us": 5}')
    # A gemm_table grid (2 x 2 x 2), as dlopt-calibrate writes one.
    table = [[m, n, k, 0.25 + 0.5 * (m == 256)]
             for m in (16, 256) for n in (16, 256) for k in (16, 256)]
    write(os.path.join(CORPUS, "calibration", "gemm-table.json"),
          json.dumps({"matmul_small_efficiency": 0.3, "gemm_table": table}))
    # A collective_table, as dlopt-calibrate --nccl-tests writes one.
    write(os.path.join(CORPUS, "calibration", "collective-table.json"),
          json.dumps({"collective_table": [
              {"collective": c, "ranks": 8, "nodes": 1, "ranks_per_node": 8,
               "bytes": b, "us": us}
              for c in ("all_reduce", "all_gather")
              for b, us in ((1048576, 27.39), (16777216, 123.78))]}, indent=1))
    # A dlopt-run --profile-json of the tiny GPT's training step (cpu).
    shutil.rmtree(os.path.join(CORPUS, "profile"), ignore_errors=True)
    m = os.path.join(tmp, "p.mlir")
    gen("gpt", "--preset", "gpt-tiny", "-o", m)
    comp(m, "--train", "-o", os.path.join(tmp, "p.plan"))
    run([os.path.join(bindir, "dlopt-run"), os.path.join(tmp, "p.plan"), "--steps", "2",
         "--quiet", "--profile-json", os.path.join(tmp, "p.json")])
    prof = json.load(open(os.path.join(tmp, "p.json")))
    prof["instructions"] = prof["instructions"][:12]
    write(os.path.join(CORPUS, "profile", "cpu-gpt-tiny.json"), json.dumps(prof, indent=1) + "\n")
    # A hand-written cuda one: a GEMM with its shape and a causal attention.
    cuda = {"format": "dlopt-profile", "version": 1, "backend": "cuda", "device_timed": True,
            "runs": 2, "skipped": 1, "wall_seconds": 0.01, "issue_seconds": 0.001,
            "instructions_per_run": 2, "instructions": [
                {"index": 0, "op": "matmul", "calls": 2, "seconds": 0.002, "layer": 0,
                 "communication": False,
                 "results": ["1024x1024xbf16"], "operands": ["1024x512xbf16", "512x1024xbf16"],
                 "flops": 1073741824, "bytes": 4194304,
                 "gemm": {"m": 1024, "n": 1024, "k": 512, "batch": 1}, "loc": "m.mlir:1:1"},
                {"index": 1, "op": "attention", "calls": 2, "seconds": 0.001, "layer": 0,
                 "results": ["1x8x128x64xbf16"],
                 "operands": ["1x8x128x64xbf16", "1x2x128x64xbf16", "1x2x128x64xbf16"],
                 "flops": 33554432, "bytes": 393216, "causal": True, "loc": ""}]}
    write(os.path.join(CORPUS, "profile", "cuda-small.json"), json.dumps(cuda, indent=1) + "\n")
    shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("out")
    r = sub.add_parser("regenerate")
    r.add_argument("bindir")
    a = ap.parse_args()
    if a.cmd == "collect":
        collect(a.out)
    else:
        regenerate(a.bindir)


if __name__ == "__main__":
    main()
