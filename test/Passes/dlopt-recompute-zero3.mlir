// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd zero=3" --dlopt-recompute="policy=full" | FileCheck %s

// Full recomputation of a ZeRO-3 step: each layer's recomputed forward
// gathers its parameter again (the clone of the forward gather), and the
// backward pass reads that gather instead of gathering a third time: one
// gather per parameter per backward pass, as FSDP with activation
// checkpointing.
// CHECK-LABEL: func.func @main
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<2x4xf32> {dlopt.global_type = tensor<4x4xf32>, dlopt.param = "w"
// CHECK-SAME: %[[V:[a-z0-9]+]]: tensor<2x3xf32> {dlopt.global_type = tensor<4x3xf32>, dlopt.param = "v"
// CHECK: shard.all_gather %[[W]] {{.+}} {dlopt.layer = 0 : i64, dlopt.zero_gather = "fwd"}
// CHECK: shard.all_gather %[[V]] {{.+}} {dlopt.layer = 1 : i64, dlopt.zero_gather = "fwd"}
// CHECK: %[[GV:.+]] = shard.all_gather %[[V]] {{.+}} {dlopt.layer = 1 : i64, dlopt.recompute, dlopt.zero_gather = "fwd"}
// CHECK: dlopt.matmul %{{.+}}, %[[GV]] {dlopt.layer = 1 : i64, dlopt.recompute}
// CHECK: dlopt.matmul %{{.+}}, %[[GV]] {dlopt.backward, dlopt.layer = 1 : i64, transpose_b}
// CHECK: %[[GW:.+]] = shard.all_gather %[[W]] {{.+}} {dlopt.layer = 0 : i64, dlopt.recompute, dlopt.zero_gather = "fwd"}
// CHECK: dlopt.matmul %{{.+}}, %[[GW]] {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NOT: zero_gather = "bwd"
// CHECK: return
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w"},
                %v: tensor<4x3xf32> {dlopt.param = "v"},
                %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %r = dlopt.tanh %h {dlopt.layer = 0 : i64} : tensor<8x4xf32>
  %o = dlopt.matmul %r, %v {dlopt.layer = 1 : i64} : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %s = dlopt.tanh %o {dlopt.layer = 1 : i64} : tensor<8x3xf32>
  %l = dlopt.mse %s, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}
