"""Copies dlopt-gen's mlp-small model (argv[1] -> argv[2]) with a reshape
round trip (256x256 -> 256x16x16 -> 256x256) between the first layer's
relu and the second matmul: the same program, two views more."""
import sys

src = open(sys.argv[1]).read()
old = "%fc1_mm = dlopt.matmul %fc0_act,"
assert old in src, "not dlopt-gen's mlp-small"
new = ("%v3 = dlopt.reshape %fc0_act : tensor<256x256xf32> -> tensor<256x16x16xf32>\n"
       "  %v2 = dlopt.reshape %v3 : tensor<256x16x16xf32> -> tensor<256x256xf32>\n"
       "  %fc1_mm = dlopt.matmul %v2,")
open(sys.argv[2], "w").write(src.replace(old, new))
