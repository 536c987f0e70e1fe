"""Writes corrupted plan files and mismatched .npy inputs for errors.test."""
import os
import sys

import numpy as np

d = sys.argv[1]
plan = open(os.path.join(d, "m.plan"), "rb").read()
open(os.path.join(d, "trunc.plan"), "wb").write(plan[: len(plan) // 2])
open(os.path.join(d, "header.plan"), "wb").write(plan[:12])
v = bytearray(plan)
v[8] = 7  # the u32 format version follows the 8-byte magic
open(os.path.join(d, "version.plan"), "wb").write(bytes(v))
f = bytearray(plan)
f[len(f) // 2] ^= 0x10
open(os.path.join(d, "flip.plan"), "wb").write(bytes(f))

rng = np.random.default_rng()
np.save(os.path.join(d, "labels.npy"), rng.integers(0, 128, (2, 16), dtype=np.int32))
np.save(os.path.join(d, "short.npy"), rng.integers(0, 128, (2, 8), dtype=np.int32))
np.save(os.path.join(d, "float.npy"), rng.random((2, 16), dtype=np.float32))
np.save(os.path.join(d, "oob.npy"), np.full((2, 16), 1000, dtype=np.int32))
open(os.path.join(d, "garbage.npy"), "wb").write(b"\x93NUMPY\x01\x00garbage")
