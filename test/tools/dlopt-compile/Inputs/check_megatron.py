"""Prints the Megatron shardings of a gpt-tiny transformer plan, one line per
role (dry-run.test checks them), and checks that the plan's op ids are the
ones dlopt-compile stamps on the model (dlopt.id in --emit mlir)."""
import json
import re
import subprocess
import sys

plan = json.load(open(sys.argv[1]))
ops = plan["ops"]
args = {a["name"]: a["sharding"] for a in plan["args"]}


def s(sh):
    dims = [".".join(d) if d else "-" for d in sh["split"]]
    out = "[" + ", ".join(dims) + "]"
    if sh["partial"]:
        out += " partial(" + ", ".join(sh["partial"]) + ")"
    return out


# The model's ops in program order; the plan lists them by stable id.
by_id = {o["id"]: o for o in ops}
assert [o["id"] for o in ops] == list(range(len(ops))), "ids are positions"
matmuls = [o for o in ops if o["op"] == "dlopt.matmul"]
# Layer 0: q, k, v, attention output, fc1, fc2; then the LM head.
q, k, v, wo, fc1, fc2 = matmuls[:6]
print("qkv", q["strategy"], s(q["results"][0]), "h0.attn.wq", s(args["h0.attn.wq"]))
assert k["strategy"] == v["strategy"] == "column"
print("attn-out", wo["strategy"], s(wo["results"][0]), "h0.attn.wo",
      s(args["h0.attn.wo"]), )
print("fc1", fc1["strategy"], s(fc1["results"][0]), "h0.mlp.w1", s(args["h0.mlp.w1"]))
print("fc2", fc2["strategy"], s(fc2["results"][0]), "h0.mlp.w2", s(args["h0.mlp.w2"]))
att = next(o for o in ops if o["op"] == "dlopt.attention")
print("attention", att["strategy"], s(att["results"][0]))
emb = ops[0]
assert emb["op"] == "dlopt.gather"
print("embedding", emb["strategy"], "wte", s(args["wte"]), "result", s(emb["results"][0]))
ln1 = next(o for o in ops if o["op"] == "dlopt.layer_norm")
print("ln1", ln1["strategy"], s(ln1["results"][0]))
head = matmuls[-1]
print("lm-head", head["strategy"], s(head["results"][0]))
loss = next(o for o in ops if o["op"] == "dlopt.cross_entropy")
print("loss", loss["strategy"], s(loss["operands"][0]), s(loss["results"][0]))

# The compiler stamps the same ids on the same ops.
mlir = subprocess.run(["dlopt-compile", sys.argv[2], "--emit=mlir", "-o", "-",
                       "--fuse-elementwise=false"],
                      check=True, capture_output=True, text=True).stdout
stamped = {}
for line in mlir.splitlines():
    m = re.search(r"= (\S+) .*dlopt\.id = (\d+) : i64", line)
    if m:
        stamped[int(m.group(2))] = m.group(1)
same = [i for i, name in stamped.items() if i in by_id and by_id[i]["op"] == name]
assert len(same) == len(stamped) and len(same) > 0.9 * len(ops), (len(same), len(stamped), len(ops))
print("ids match the compiler's")
