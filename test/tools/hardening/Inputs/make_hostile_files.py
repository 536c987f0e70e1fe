#!/usr/bin/env python3
"""Writes the hostile inputs of hardening.test into DIR (issue 10's classes):
deeply nested JSON behind valid checksums, YAML alias bombs, duplicate keys,
non-finite numbers, overflowing shapes, a checkpoint at step INT64_MAX, a
stale temporary checkpoint file, Fortran-order tokens.

  make_hostile_files.py DIR PLAN CHECKPOINT
"""
import json
import os
import socket
import struct
import subprocess
import sys

import numpy as np

out, plan_path, ckpt_path = sys.argv[1], sys.argv[2], sys.argv[3]


def w(name, data):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(out, name), mode) as f:
        f.write(data)


DEEP = 90000
deep_json = "[" * DEEP + "]" * DEEP

# Cluster files.
cluster = {"name": "c", "nodes": 1, "gpus_per_node": 2,
           "gpu": {"memory_gb": 80, "memory_bandwidth_gb_s": 3000,
                   "peak_tflops": {"bf16": 900}},
           "intra_node": {"bandwidth_gb_s": 450, "latency_us": 1}}
w("deep-cluster.json", '{"name": %s, "nodes": 1}' % deep_json)
w("dup-cluster.json", json.dumps(cluster)[:-1] + ', "nodes": 2}')
huge = dict(cluster, gpu=dict(cluster["gpu"], memory_gb=1e308))
w("huge-cluster.json", json.dumps(huge))
w("inf-cluster.yaml", """name: c
nodes: 1
gpus_per_node: 2
gpu: {memory_gb: .inf, memory_bandwidth_gb_s: 3000, peak_tflops: {bf16: 900}}
intra_node: {bandwidth_gb_s: 450, latency_us: 1}
""")
w("dup-cluster.yaml", """name: c
nodes: 1
gpus_per_node: 2
gpu: {memory_gb: 80, memory_gb: 40, memory_bandwidth_gb_s: 3000, peak_tflops: {bf16: 900}}
intra_node: {bandwidth_gb_s: 450, latency_us: 1}
""")
bomb = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
for i in range(1, 10):
    p, c = chr(ord("a") + i - 1), chr(ord("a") + i)
    bomb.append("%s: &%s [%s]" % (c, c, ",".join(["*" + p] * 10)))
w("bomb-cluster.yaml", "\n".join(bomb) + "\n")
w("many-devices.yaml", """name: big
nodes: 262144
gpus_per_node: 8
gpu: h100-sxm-80gb
intra_node: {bandwidth_gb_s: 450, latency_us: 1}
network: {bandwidth_gb_s: 50, latency_us: 5}
""")
os.makedirs(os.path.join(out, "dir.yaml"), exist_ok=True)
os.makedirs(os.path.join(out, "dir.json"), exist_ok=True)

# Plan and calibration files.
w("deep-plan.json", '{"format": "dlopt-plan", "x": %s}' % deep_json)
w("deep-cal.json", '{"attention_efficiency": %s}' % deep_json)
w("dup-cal.json", '{"attention_efficiency": 0.5, "attention_efficiency": 0.9}')


# An executable whose checksum is valid but whose JSON nests 90,000 deep.
def fnv1a64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


with open(plan_path, "rb") as f:
    exe = f.read()
magic, version, flags = exe[:8], exe[8:12], exe[12:16]
doc = ('{"x": %s}' % deep_json).encode()
payload = struct.pack("<Q", len(doc)) + doc + struct.pack("<Q", 0)
w("deep.plan", magic + version + flags + struct.pack("<QQ", len(payload), fnv1a64(payload)) + payload)

# safetensors: a deep header, and a checkpoint whose step is INT64_MAX.
header = ('{"__metadata__": {"x": "y"}, "t": %s}' % deep_json).encode()
w("deep.safetensors", struct.pack("<Q", len(header)) + header)
with open(ckpt_path, "rb") as f:
    ck = f.read()
n = struct.unpack("<Q", ck[:8])[0]
head = json.loads(ck[8:8 + n])
head["__metadata__"]["step"] = str(2**63 - 1)
newhead = json.dumps(head).encode()
newhead += b" " * ((8 - len(newhead) % 8) % 8)
w("step-max.safetensors", struct.pack("<Q", len(newhead)) + newhead + ck[8 + n:])

# Token files: a .npy whose shape multiplies past 2^64, and Fortran order.
hdr = "{'descr': '<i4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"
hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
w("overflow-tokens.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + b"\0" * 64)

# A temporary checkpoint file whose writer (a finished process) is gone.
dead = subprocess.Popen(["true"])
dead.wait()
host = socket.gethostname().replace(".", "_").replace("/", "_") or "localhost"
os.makedirs(os.path.join(out, "ckpt"), exist_ok=True)
w(os.path.join("ckpt", ".step-000001.safetensors.tmp.%s.%d" % (host, dead.pid)), b"x" * 1000)
# ... and one of another host, which must be left alone.
w(os.path.join("ckpt", ".step-000001.safetensors.tmp.otherhost.%d" % dead.pid), b"x" * 1000)

# A model with a huge splat constant, and one without parameters.
w("splat.mlir", """func.func @main(%x: tensor<20000x20000xf32> {dlopt.input = "x"}) -> (tensor<20000x20000xf32> {dlopt.output = "y"}) {
  %c = arith.constant dense<0.5> : tensor<20000x20000xf32>
  %0 = dlopt.add %x, %c : tensor<20000x20000xf32>, tensor<20000x20000xf32> -> tensor<20000x20000xf32>
  return %0 : tensor<20000x20000xf32>
}
""")
w("noparams.mlir", """func.func @main(%x: tensor<4x8xf32> {dlopt.input = "x"}, %y: tensor<4x8xf32> {dlopt.input = "y"}) -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %0 = dlopt.mse %x, %y : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<f32>
  return %0 : tensor<f32>
}
""")
np.save(os.path.join(out, "tokens.npy"), (np.arange(4096) * 7919 % 64).astype(np.int32))
