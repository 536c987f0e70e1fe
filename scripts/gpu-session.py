#!/usr/bin/env python3
"""One GPU session in one command: the GPU tests, the op conformance suite,
training against the cpu backend, checkpoint resume and the benchmark.

GPU machines are lent briefly and have no MLIR (docs/gpu.md). So the work is
split in two:

  scripts/gpu-session.py prepare [--bundle .gpu]        # here: a compiler build
      copies dlopt-run, dlopt-cuda-probe and the GPU test binaries with the
      shared libraries they need (not glibc's or the compiler's), compiles
      the training plans and the op conformance cases, and writes
      BUNDLE/bundle.tar.xz (BUNDLE is git-ignored; carry it to the GPU).

  scripts/gpu-session.py run [--bundle .gpu] [--out DIR] [--budget S]
                             [--only PHASES] [--skip PHASES]
      on the GPU machine: unpacks the bundle and runs the phases in order,
      each with its own time limit, stopping before one that would overrun
      the budget. Logs and metrics go to DIR (default $OUT) as
      summary.txt, console.log and logs.tar.gz; the summary is printed last.

Phases: env probe gtest ops train grads resume parallel sanitize profile
bench.
Environment for `run`: BENCH_MODELS (default gpt2-small), TORCH_MODES
(default eager), TRAIN_STEPS (default 200).
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ["env", "probe", "gtest", "ops", "train", "grads", "resume", "parallel", "sanitize", "profile", "bench"]
SYSTEM_LIBS = ("linux-vdso", "libc.so", "libm.so", "ld-linux", "libgcc_s", "libstdc++",
               "libpthread", "libdl.so", "librt.so")

# Training plans: name -> dlopt-gen args, dlopt-compile args.
TRAIN_PLANS = {
    "gpt-tiny.f32": (["gpt", "--preset", "gpt-tiny"], ["--precision", "f32"]),
    "gpt-tiny.bf16": (["gpt", "--preset", "gpt-tiny"], ["--precision", "bf16"]),
    "gpt-tiny.fp16": (["gpt", "--preset", "gpt-tiny"], ["--precision", "fp16"]),
    "llama-tiny.bf16": (["llama", "--preset", "llama-tiny"], ["--precision", "bf16"]),
    "mlp-tiny.f32": (["mlp", "--preset", "mlp-tiny"], ["--precision", "f32"]),
    "resnet-tiny.f32": (["resnet", "--preset", "resnet-tiny"], ["--precision", "f32"]),
    # Head dim 64: attention on the tensor cores in bf16 and fp16.
    "gpt-hd64.bf16": (["gpt", "--preset", "gpt-tiny", "--hidden", "128", "--heads", "2", "--seq", "96",
                       "--vocab", "256"], ["--precision", "bf16"]),
    "gpt-hd64.fp16": (["gpt", "--preset", "gpt-tiny", "--hidden", "128", "--heads", "2", "--seq", "96",
                       "--vocab", "256"], ["--precision", "fp16"]),
    # One SGD step at two learning rates: p(lr=1) - p(lr=2) is the gradient,
    # so the backends' raw gradients can be compared (phase grads).
    "resnet-tiny.sgd1": (["resnet", "--preset", "resnet-tiny"], ["--optimizer", "sgd", "--lr", "1"]),
    "resnet-tiny.sgd2": (["resnet", "--preset", "resnet-tiny"], ["--optimizer", "sgd", "--lr", "2"]),
    "gpt-tiny.sgd1": (["gpt", "--preset", "gpt-tiny"], ["--optimizer", "sgd", "--lr", "1"]),
    "gpt-tiny.sgd2": (["gpt", "--preset", "gpt-tiny"], ["--optimizer", "sgd", "--lr", "2"]),
}
# In-graph multi-rank plans (ranks as threads on the one GPU, host-staged
# communication): name -> base plan, --fix, cluster.
PARALLEL_PLANS = {
    "gpt-tiny.f32.dp2tp2": ("gpt-tiny.f32", "dp=2,tp=2", "cpu:2"),
    "gpt-tiny.f32.pp2dp2": ("gpt-tiny.f32", "pp=2,dp=2,zero=1,schedule=1f1b", "cpu:2"),
}
BINARIES = {"bin/dlopt-run": "dlopt-run", "bin/dlopt-cuda-probe": "dlopt-cuda-probe",
            "test/unit/cuda/dlopt-cuda-backend-tests": "dlopt-cuda-backend-tests",
            "test/unit/comm/dlopt-cuda-tests": "dlopt-cuda-tests"}


def sh(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def prepare(args):
    build = os.path.join(ROOT, args.build)
    bundle = os.path.join(ROOT, args.bundle)
    stage = os.path.join(bundle, "stage")
    shutil.rmtree(stage, ignore_errors=True)
    for d in ("libexec", "lib", "plans", "cases"):
        os.makedirs(os.path.join(stage, d))
    libs = set()
    for src, name in BINARIES.items():
        dst = os.path.join(stage, "libexec", name)
        shutil.copy2(os.path.join(build, src), dst)
        sh(["strip", "--strip-unneeded", dst])
        out = subprocess.run(["ldd", dst], stdout=subprocess.PIPE, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                if not any(parts[0].startswith(s) for s in SYSTEM_LIBS):
                    libs.add(parts[2])
    for lib in sorted(libs):
        shutil.copy2(os.path.realpath(lib), os.path.join(stage, "lib", os.path.basename(lib)))
    bin_dir = os.path.join(build, "bin")
    gen, comp = os.path.join(bin_dir, "dlopt-gen"), os.path.join(bin_dir, "dlopt-compile")
    plans = os.path.join(stage, "plans")
    for name, (gargs, cargs) in TRAIN_PLANS.items():
        m = os.path.join(plans, name + ".mlir")
        sh([gen] + gargs + ["-q", "-o", m])
        sh([comp, m, "--train", "--quiet", "-o", os.path.join(plans, name + ".plan")] + cargs)
    for name, (base, fix, cluster) in PARALLEL_PLANS.items():
        m = os.path.join(plans, base + ".mlir")
        cargs = TRAIN_PLANS[base][1]
        sh([comp, m, "--train", "--quiet", "-o", os.path.join(plans, name + ".plan"),
            "--cluster", cluster, "--fix", fix] + cargs)
    for m in glob.glob(os.path.join(plans, "*.mlir")):
        os.remove(m)
    # The benchmark's plans and planner estimates (scripts/bench-gpu.sh).
    env = dict(os.environ, BUILD=args.build, MODELS=args.bench_models)
    sh([os.path.join(ROOT, "scripts", "bench-gpu.sh"), "prepare", os.path.join(stage, "bench")], env=env)
    for m in glob.glob(os.path.join(stage, "bench", "*.mlir")):
        os.remove(m)
    # The op conformance cases, compiled and run on the cpu backend here.
    sh([sys.executable, os.path.join(ROOT, "test", "numeric", "check_ops.py"), "--backend", "cpu",
        "--work-dir", os.path.join(stage, "cases")], stdout=subprocess.DEVNULL)
    for d in glob.glob(os.path.join(stage, "cases", "*", "out")):
        shutil.rmtree(d)
    out = os.path.join(bundle, "bundle.tar.xz")
    with tarfile.open(out, "w:xz") as t:
        t.add(stage, arcname="bundle")
    shutil.rmtree(stage)
    print("gpu-session: wrote %s (%.1f MiB)" % (out, os.path.getsize(out) / 2**20))


class Session:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.deadline = self.t0 + args.budget
        self.out = args.out or os.environ.get("OUT") or os.path.join(ROOT, "out", "gpu-session")
        os.makedirs(self.out, exist_ok=True)
        self.logs = os.path.join("/tmp", "dlopt-gpu-logs")
        shutil.rmtree(self.logs, ignore_errors=True)
        os.makedirs(self.logs)
        self.summary = []
        self.console = open(os.path.join(self.out, "console.log"), "w")

    def say(self, line):
        print(line, flush=True)
        self.console.write(line + "\n")
        self.console.flush()

    def note(self, line):
        self.summary.append(line)
        self.say("== " + line)

    def left(self):
        return self.deadline - time.time()

    def run(self, cmd, log, timeout, env=None, cwd=None):
        """Runs cmd with its output appended to logs/LOG; returns (rc, text)."""
        timeout = max(1, min(timeout, self.left() - 5))
        path = os.path.join(self.logs, log)
        t = time.time()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=timeout, env=env, cwd=cwd, errors="replace")
            rc, text = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            rc, text = 124, (out.decode(errors="replace") if isinstance(out, bytes) else out)
            text += "\n[timed out after %d s]\n" % timeout
        except OSError as e:
            rc, text = 127, "cannot run %s: %s" % (cmd[0], e)
        with open(path, "a") as f:
            f.write("$ %s\n[rc %d, %.1f s]\n%s\n" % (" ".join(cmd), rc, time.time() - t, text))
        return rc, text


def find_cuda_libs(sess):
    """Symlinks the CUDA libraries the backend dlopen()s into one folder."""
    d = "/tmp/dlopt-cudalib"
    os.makedirs(d, exist_ok=True)
    roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
             "/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64", "/usr/local/lib"]
    try:
        import site
        for sp in site.getsitepackages():
            roots += glob.glob(os.path.join(sp, "nvidia", "*", "lib"))
    except Exception:
        pass
    # NVRTC (fused kernels compiled at run time) loads its builtins library
    # from the search path too.
    for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2", "libnvrtc.so.13",
                 "libnvrtc-builtins.so.13*"):
        for r in roots:
            found = sorted(glob.glob(os.path.join(r, name)))
            if found:
                for p in found:
                    dst = os.path.join(d, os.path.basename(p))
                    if not os.path.exists(dst):
                        os.symlink(p, dst)
                sess.say("  %s -> %s" % (name, found[0]))
                break
        else:
            sess.say("  %s: not found" % name)
    return d


def losses(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l)["loss"] for l in open(path) if l.strip()]


def rel_diffs(a, b):
    return [abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b)]


def run_session(args):
    sess = Session(args)
    bundle = os.path.join(ROOT, args.bundle)
    base = os.path.join("/tmp", "dlopt-bundle")
    if not os.path.exists(os.path.join(base, "bundle")):
        os.makedirs(base, exist_ok=True)
        with tarfile.open(os.path.join(bundle, "bundle.tar.xz")) as t:
            t.extractall(base)
    b = os.path.join(base, "bundle")
    libexec, bindir = os.path.join(b, "libexec"), os.path.join(b, "bin")
    os.makedirs(bindir, exist_ok=True)
    for name in os.listdir(libexec):
        w = os.path.join(bindir, name)
        with open(w, "w") as f:
            f.write('#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n'
                    % (os.path.join(b, "lib"), os.path.join(libexec, name)))
        os.chmod(w, 0o755)
    tool = lambda n: os.path.join(bindir, n)  # noqa: E731
    sess.say("gpu-session: bundle unpacked in %.1f s" % (time.time() - sess.t0))
    libdir = find_cuda_libs(sess)
    env = dict(os.environ, DLOPT_CUDA_LIB_DIR=libdir, PYTHONUNBUFFERED="1",
               LD_LIBRARY_PATH=libdir + (":" + os.environ["LD_LIBRARY_PATH"]
                                         if os.environ.get("LD_LIBRARY_PATH") else ""))
    only = set(args.only.split(",")) if args.only else set(PHASES)
    skip = set(args.skip.split(",")) if args.skip else set()
    phases = [p for p in PHASES if p in only and p not in skip]
    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    plans = os.path.join(b, "plans")

    for phase in phases:
        if sess.left() < 20:
            sess.note("%s: skipped, budget spent" % phase)
            continue
        t = time.time()
        sess.say("--- phase %s (%.0f s left)" % (phase, sess.left()))
        if phase == "env":
            for cmd in (["nvidia-smi"], ["nvidia-smi", "--query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version",
                                         "--format=csv"],
                        [sys.executable, "-c", "import torch, numpy; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'numpy', numpy.__version__)"],
                        ["ldd", os.path.join(libexec, "dlopt-run")], ["nproc"], ["uname", "-a"]):
                rc, text = sess.run(cmd, "env.log", 60, env=env)
            rc, text = sess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                "env.log", 30, env=env)
            sess.note("device: " + text.strip())
        elif phase == "probe":
            rc, text = sess.run([tool("dlopt-cuda-probe")], "probe.log", 60, env=env)
            sess.note("probe rc %d: %s" % (rc, text.strip().splitlines()[-1] if text.strip() else ""))
            if rc != 0:
                sess.say(text)
        elif phase == "gtest":
            for name, filt in (("dlopt-cuda-tests", "CudaGpu.*"), ("dlopt-cuda-backend-tests", "*CudaGpu*:FusedJit*")):
                rc, text = sess.run([tool(name), "--gtest_filter=" + filt], "gtest.log", 150, env=env)
                fails = [l for l in text.splitlines() if l.startswith("[  FAILED  ]")]
                tail = [l for l in text.splitlines() if l.startswith("[  PASSED  ]") or "tests ran" in l]
                sess.note("gtest %s rc %d: %s; %d failed lines" % (name, rc, "; ".join(tail), len(fails)))
                for l in fails[:40]:
                    sess.note("  " + l)
                if name != "dlopt-cuda-backend-tests":
                    continue
                # Kernels not yet verified on a GPU are opt-in; the later
                # phases run them where their tests passed here. The mma.sync
                # attention: DLOPT_CUDA_ATTENTION=mma, else the WMMA default,
                # else (WMMA failing too) the CUDA-core kernels.
                if "DLOPT_CUDA_ATTENTION" not in env:
                    attn_fail = [l for l in text.splitlines() if "kernels" in l and "on the " in l]
                    if "[       OK ] CudaGpu.AttentionOnEveryKernelPathMatchesTheCpu" in text:
                        env["DLOPT_CUDA_ATTENTION"] = "mma"
                        sess.note("mma.sync attention passed: later phases run DLOPT_CUDA_ATTENTION=mma")
                    elif any("on the WMMA kernels" in l for l in attn_fail):
                        env["DLOPT_CUDA_ATTENTION"] = "simt"
                        sess.note("WMMA attention failed: later phases run DLOPT_CUDA_ATTENTION=simt")
                    else:
                        sess.note("mma.sync attention failed or did not run: later phases keep the WMMA kernels")
                    for l in attn_fail[:10]:
                        sess.note("  " + l[:240])
                if "DLOPT_CUDA_GEMM_PAD" not in env:
                    if "[       OK ] CudaGpu.UnalignedGemmsMatchTheCpuWithAndWithoutPadding" in text:
                        env["DLOPT_CUDA_GEMM_PAD"] = "1"
                        sess.note("padded unaligned GEMMs passed: later phases run DLOPT_CUDA_GEMM_PAD=1")
                    else:
                        sess.note("padded unaligned GEMMs failed or did not run: later phases run them unpadded")
        elif phase == "ops":
            rc, text = sess.run([sys.executable, os.path.join(ROOT, "test", "unit", "cuda", "compare_backends.py"),
                                 "--cases", os.path.join(b, "cases"), "--bin-dir", bindir, "--jobs", "8",
                                 "--timeout", "60"] + (["--filter", os.environ["OPS_FILTER"]]
                                                       if os.environ.get("OPS_FILTER") else []),
                                "ops.log", 240, env=env)
            lines = text.strip().splitlines()
            sess.note("ops rc %d: %s" % (rc, lines[-1] if lines else ""))
            for l in [l for l in lines if l.startswith("FAIL")][:40]:
                sess.note("  " + l[:240])
            uns = [l.split(":")[0] for l in lines if l.startswith("UNSUPPORTED")]
            if uns:
                sess.note("  unsupported: " + " ".join(u.split()[1] for u in uns))
        elif phase == "train":
            results = {}
            for name in ("gpt-tiny.f32", "gpt-tiny.bf16", "gpt-tiny.fp16", "gpt-hd64.bf16", "gpt-hd64.fp16",
                         "llama-tiny.bf16", "mlp-tiny.f32", "resnet-tiny.f32"):
                n = steps if name.startswith("gpt-tiny") else max(20, steps // 4)
                curves = {}
                for backend in ("cpu", "cuda"):
                    m = os.path.join(sess.logs, "%s.%s.jsonl" % (name, backend))
                    if os.path.exists(m):
                        os.remove(m)
                    t1 = time.time()
                    rc, text = sess.run([tool("dlopt-run"), os.path.join(plans, name + ".plan"), "--backend", backend,
                                         "--steps", str(n), "--seed", "3", "--metrics", m, "--log-every", "50"],
                                        "train.log", 120, env=env)
                    curves[backend] = (rc, losses(m), time.time() - t1, text)
                (rc_c, lc, tc, _), (rc_g, lg, tg, text_g) = curves["cpu"], curves["cuda"]
                d = rel_diffs(lg, lc)
                bitwise = len(lg) == len(lc) and lg == lc
                line = ("train %s: %d steps, cpu rc %d %.1f s, cuda rc %d %.1f s; loss cpu %s -> %s, cuda %s -> %s; "
                        "max rel diff %s%s" % (name, n, rc_c, tc, rc_g, tg,
                                              lc[0] if lc else "-", lc[-1] if lc else "-",
                                              lg[0] if lg else "-", lg[-1] if lg else "-",
                                              "%.2e (step %d)" % (max(d), d.index(max(d)) + 1) if d else "-",
                                              ", bitwise" if bitwise else ""))
                sess.note(line)
                if rc_g != 0:
                    sess.note("  cuda: " + " | ".join(text_g.strip().splitlines()[-4:])[:600])
                mem = [l for l in text_g.splitlines() if "device memory" in l]
                if mem:
                    sess.note("  " + mem[-1].strip())
                results[name] = {"cpu": lc, "cuda": lg}
            with open(os.path.join(sess.logs, "train-curves.json"), "w") as f:
                json.dump(results, f)
            # One step's updated params, cpu against cuda: where a curve
            # drifts, this says which params' gradients differ.
            import numpy as np
            for name in ("gpt-tiny.f32", "resnet-tiny.f32"):
                dirs = {}
                for backend in ("cpu", "cuda"):
                    d = os.path.join(sess.logs, "params1-%s-%s" % (name, backend))
                    shutil.rmtree(d, ignore_errors=True)
                    sess.run([tool("dlopt-run"), os.path.join(plans, name + ".plan"), "--backend", backend,
                              "--steps", "1", "--seed", "3", "--quiet", "--save-params", d], "train.log", 60, env=env)
                    dirs[backend] = d
                errs = []
                for f in sorted(glob.glob(os.path.join(dirs["cpu"], "*.npy"))):
                    g = os.path.join(dirs["cuda"], os.path.basename(f))
                    if not os.path.exists(g):
                        errs.append((float("inf"), os.path.basename(f)))
                        continue
                    a, c = np.load(f).astype(np.float64), np.load(g).astype(np.float64)
                    errs.append((float(np.linalg.norm(c - a) / max(np.linalg.norm(a), 1e-30)), os.path.basename(f)))
                errs.sort(reverse=True)
                sess.note("params after 1 step %s, cuda vs cpu, worst |d|/|p|: %s" % (
                    name, ", ".join("%s %.2e" % (n, e) for e, n in errs[:4])))
        elif phase == "grads":
            # Raw gradients after one step, cuda against cpu, per param:
            # |g_cuda - g_cpu| / |g_cpu| with g = p(lr=1) - p(lr=2).
            import numpy as np
            for model in ("gpt-tiny", "resnet-tiny"):
                saved = {}
                for tag, backend in (("sgd1", "cpu"), ("sgd2", "cpu"), ("sgd1", "cuda")):
                    d = os.path.join(sess.logs, "grads-%s-%s-%s" % (model, tag, backend))
                    shutil.rmtree(d, ignore_errors=True)
                    sess.run([tool("dlopt-run"), os.path.join(plans, "%s.%s.plan" % (model, tag)), "--backend",
                              backend, "--steps", "1", "--seed", "3", "--quiet", "--save-params", d],
                             "grads.log", 60, env=env)
                    saved[(tag, backend)] = d
                errs = []
                for f in sorted(glob.glob(os.path.join(saved[("sgd1", "cpu")], "*.npy"))):
                    n = os.path.basename(f)
                    other = [os.path.join(saved[k], n) for k in (("sgd2", "cpu"), ("sgd1", "cuda"))]
                    if not all(os.path.exists(o) for o in other):
                        errs.append((float("inf"), n))
                        continue
                    p1 = np.load(f).astype(np.float64)
                    g = p1 - np.load(other[0]).astype(np.float64)
                    dg = np.load(other[1]).astype(np.float64) - p1
                    errs.append((float(np.linalg.norm(dg) / max(np.linalg.norm(g), 1e-30)), n))
                errs.sort(reverse=True)
                sess.note("grads after 1 step %s, cuda vs cpu, worst |dg|/|g|: %s" % (
                    model, ", ".join("%s %.2e" % (n, e) for e, n in errs[:4])))
        elif phase == "resume":
            for name in ("gpt-tiny.f32", "gpt-tiny.bf16"):
                d = os.path.join(sess.logs, "resume-" + name)
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
                common = [tool("dlopt-run"), os.path.join(plans, name + ".plan"), "--backend", "cuda", "--seed", "3",
                          "--quiet"]
                sess.run(common + ["--steps", "20", "--metrics", os.path.join(d, "full.jsonl")], "resume.log", 60, env=env)
                sess.run(common + ["--steps", "10", "--checkpoint-dir", os.path.join(d, "ck")], "resume.log", 60, env=env)
                cks = sorted(glob.glob(os.path.join(d, "ck", "step-*")))
                rc, _ = sess.run(common + ["--steps", "10", "--resume", cks[-1] if cks else "missing",
                                           "--metrics", os.path.join(d, "rest.jsonl")], "resume.log", 60, env=env)
                full, rest = losses(os.path.join(d, "full.jsonl")), losses(os.path.join(d, "rest.jsonl"))
                same = len(full) == 20 and rest == full[10:]
                sess.note("resume %s on cuda: %s (uninterrupted steps 11-20 %s, resumed %s)" % (
                    name, "bitwise" if same else "DIFFERENT", full[10:13], rest[:3]))
        elif phase == "parallel":
            for name, (base_name, fix, _) in PARALLEL_PLANS.items():
                curves = {}
                for tag, plan in (("one", base_name), ("par", name)):
                    m = os.path.join(sess.logs, "%s.%s.cuda.jsonl" % (name, tag))
                    if os.path.exists(m):
                        os.remove(m)
                    rc, text = sess.run([tool("dlopt-run"), os.path.join(plans, plan + ".plan"), "--backend", "cuda",
                                         "--steps", "6", "--seed", "3", "--vocab", "128", "--metrics", m],
                                        "parallel.log", 90, env=env)
                    curves[tag] = (rc, losses(m), text)
                d = rel_diffs(curves["par"][1], curves["one"][1])
                sess.note("parallel %s (%s) on cuda, ranks as threads: rc %d/%d, losses %s vs one device %s, max rel diff %s" % (
                    name, fix, curves["one"][0], curves["par"][0], curves["par"][1][:3], curves["one"][1][:3],
                    "%.2e" % max(d) if d else "-"))
                if curves["par"][0] != 0:
                    sess.note("  " + " | ".join(curves["par"][2].strip().splitlines()[-4:])[:600])
        elif phase == "bench":
            benv = dict(env, BUILD=os.path.relpath(b, ROOT), MODELS=os.environ.get("BENCH_MODELS", "gpt2-small"),
                        TORCH_MODES=os.environ.get("TORCH_MODES", "eager"), PYTHON=sys.executable)
            bout = os.path.join(sess.logs, "bench")
            rc, text = sess.run([os.path.join(ROOT, "scripts", "bench-gpu.sh"), "run", os.path.join(b, "bench"), bout],
                                "bench.log", 400, env=benv)
            summ = os.path.join(bout, "summary.txt")
            if os.path.exists(summ):
                for l in open(summ):
                    sess.note("bench " + l.rstrip())
            # Host issue time against run time per dlopt step (median of
            # the timed steps): issue close to run means host-bound.
            for mf in sorted(glob.glob(os.path.join(bout, "*.dlopt-metrics.jsonl"))):
                rows = [json.loads(l) for l in open(mf) if l.strip()]
                rows = [r for r in rows if "issue_time_s" in r][2:]
                if rows:
                    med = lambda k: sorted(r[k] for r in rows)[len(rows) // 2]  # noqa: E731
                    sess.note("bench %s dlopt: step %.1f ms, run %.1f ms, host issue %.1f ms (median of %d steps)" % (
                        os.path.basename(mf).split(".dlopt")[0], 1e3 * med("step_time_s"), 1e3 * med("run_time_s"),
                        1e3 * med("issue_time_s"), len(rows)))
            else:
                sess.note("bench rc %d: %s" % (rc, " | ".join(text.strip().splitlines()[-5:])[:600]))
                res = os.path.join(bout, "results.jsonl")
                for l in (open(res) if os.path.exists(res) else []):
                    sess.note("bench row " + l.strip()[:400])
        elif phase == "profile":
            # Device time per op kind and the slowest instructions (dlopt-run
            # --profile: events around each instruction) for the first
            # benchmark model; then the fused ops on the interpreter kernel.
            m = os.environ.get("BENCH_MODELS", "gpt2-small").split()[0]
            # Variants: the older WMMA attention kernels, and unaligned
            # GEMMs (the tied LM head) without padded copies.
            variants = [("", {})]
            if env.get("DLOPT_CUDA_ATTENTION") == "mma":
                variants.append((" DLOPT_CUDA_ATTENTION=wmma", {"DLOPT_CUDA_ATTENTION": "wmma"}))
            if env.get("DLOPT_CUDA_GEMM_PAD") == "1":
                variants.append((" DLOPT_CUDA_GEMM_PAD=0", {"DLOPT_CUDA_GEMM_PAD": "0"}))
            for variant, venv in variants:
                # The default variant also writes the profile as JSON, which
                # comes back in $OUT: `dlopt-calibrate --from-profile
                # FILE --gpu PRESET` turns it into the calibration that
                # prices dlopt's own kernels on this GPU.
                pj = [] if variant else ["--profile-json", os.path.join(sess.out, "profile-%s.json" % m)]
                rc, text = sess.run([tool("dlopt-run"), os.path.join(b, "bench", m + ".plan"), "--backend", "cuda",
                                     "--steps", "4", "--vocab", "50257", "--profile"] + pj, "profile.log", 120,
                                    env=dict(env, **venv))
                lines = text.strip().splitlines()
                start = next((i for i, l in enumerate(lines) if l.startswith("profile")), max(0, len(lines) - 25))
                sess.note("profile %s%s rc %d:" % (m, variant, rc))
                shown = lines[start:start + 45] if not variant else \
                    [l for l in lines[start:] if l.startswith("profile") or "per run" in l or
                     l.split()[:1] in (["matmul"], ["attention"], ["attention_grad"])][:8]
                for l in shown:
                    sess.note("  " + l[:200])
                steps = [l for l in lines if l.startswith("step ") or "tokens/s" in l]
                for l in steps[-2:]:
                    sess.note("  " + l[:200])
            # The same GEMM shapes through PyTorch (cuBLAS), for comparison.
            code = r"""
import torch
def t(f, n=20):
    for _ in range(3): f()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n
bf = torch.bfloat16
for (m, k, n) in [(8192, 768, 768), (8192, 768, 3072), (8192, 3072, 768), (8192, 768, 50257)]:
    a = torch.randn(m, k, device='cuda', dtype=bf); b = torch.randn(k, n, device='cuda', dtype=bf)
    ms = t(lambda: a @ b)
    print('torch gemm %dx%dx%d: %.3f ms, %.0f TFLOP/s' % (m, k, n, ms, 2 * m * k * n / ms / 1e9))
a = torch.randn(8, 1024, 768, device='cuda', dtype=bf); b = torch.randn(8, 1024, 3072, device='cuda', dtype=bf)
ms = t(lambda: a.transpose(1, 2) @ b)
print('torch batched a^T b 8x(768x1024x3072): %.3f ms, %.0f TFLOP/s' % (ms, 2 * 8 * 768 * 1024 * 3072 / ms / 1e9))
q = torch.randn(8, 12, 1024, 64, device='cuda', dtype=bf, requires_grad=True)
ms = t(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
print('torch sdpa causal 8x12x1024x64 fwd: %.3f ms' % ms)
o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
g = torch.randn_like(o)
ms = t(lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), q, g))
print('torch sdpa causal 8x12x1024x64 fwd+bwd: %.3f ms' % ms)
"""
            rc, text = sess.run([sys.executable, "-c", code], "profile.log", 60, env=env)
            for l in text.strip().splitlines()[-8:]:
                sess.note("  " + l[:200])
        elif phase == "sanitize":
            cs = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
            # gpt-hd64 bf16 runs the tensor-core attention kernels.
            for toolname in ("memcheck", "racecheck"):
                rc, text = sess.run([cs, "--tool", toolname, "--error-exitcode", "9", os.path.join(libexec, "dlopt-run"),
                                     os.path.join(plans, "gpt-hd64.bf16.plan"), "--backend", "cuda", "--steps", "1",
                                     "--quiet"], "sanitize.log", 120,
                                    env=dict(env, LD_LIBRARY_PATH=os.path.join(b, "lib")))
                sess.note("sanitize (%s, gpt-hd64 bf16, 1 step) rc %d: %s" % (
                    toolname, rc, " | ".join(text.strip().splitlines()[-3:])[:400]))
        sess.say("--- phase %s took %.1f s" % (phase, time.time() - t))

    with open(os.path.join(sess.out, "summary.txt"), "w") as f:
        f.write("\n".join(sess.summary) + "\n")
    with tarfile.open(os.path.join(sess.out, "logs.tar.gz"), "w:gz") as t:
        t.add(sess.logs, arcname="logs")
    sess.say("gpu-session: %.0f s; summary:" % (time.time() - sess.t0))
    print("\n".join(sess.summary))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--bundle", default=".gpu")
    p.add_argument("--build", default="build")
    p.add_argument("--bench-models", default="gpt2-small gpt2-medium gpt2-large gpt3-1.3b")
    r = sub.add_parser("run")
    r.add_argument("--bundle", default=".gpu")
    r.add_argument("--out")
    r.add_argument("--budget", type=float, default=300)
    r.add_argument("--only")
    r.add_argument("--skip")
    args = ap.parse_args()
    return prepare(args) if args.cmd == "prepare" else run_session(args)


if __name__ == "__main__":
    sys.exit(main())
