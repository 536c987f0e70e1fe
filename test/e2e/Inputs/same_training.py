"""Two training runs gave bit for bit the same losses (metrics JSONL) and
the same parameter bytes (--save-params directories of .npy files)."""
import json
import os
import sys

a_metrics, b_metrics, a_dir, b_dir = sys.argv[1:5]
la = [json.loads(l)["loss"] for l in open(a_metrics) if l.strip()]
lb = [json.loads(l)["loss"] for l in open(b_metrics) if l.strip()]
if not la or la != lb:
    sys.exit("losses differ: %s vs %s" % (la, lb))
names = sorted(os.listdir(a_dir))
if not names or names != sorted(os.listdir(b_dir)):
    sys.exit("different param files")
for n in names:
    with open(os.path.join(a_dir, n), "rb") as fa, open(os.path.join(b_dir, n), "rb") as fb:
        if fa.read() != fb.read():
            sys.exit("param %s differs" % n)
print("same losses over %d steps; same bytes in %d params" % (len(la), len(names)))
