// RUN: dlopt-opt %s --pass-pipeline="builtin.module(func.func(dlopt-fuse-elementwise{min-group-size=1}))" --verify-diagnostics

// expected-error @+1 {{dlopt-fuse-elementwise: expects min-group-size >= 2, got 1}}
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = dlopt.exp %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
