// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=tp sizes=2" --dlopt-recompute="policy=selective" | FileCheck %s
// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=tp sizes=2" --dlopt-recompute="policy=none" | FileCheck %s --check-prefix=NONE
// RUN: dlopt-opt %S/Inputs/recompute-cp.mlir --dlopt-autodiff --dlopt-partition="axes=cp sizes=2" --dlopt-recompute="policy=selective" | FileCheck %s --check-prefix=CP

// Selective recomputation under sequence parallelism: the layer keeps the
// norm output's shard, and the backward pass gathers it again over tp
// (a clone marked dlopt.recompute, before the layer's first backward op)
// for the column-parallel weight's gradient, as Megatron-LM does. The
// forward gather dies after the forward matmul. The backward pass's own
// gather of the output gradient is not a forward value: it stays.
// CHECK-LABEL: func.func @main
// CHECK: %[[N:.+]] = dlopt.layer_norm
// CHECK: %[[G:.+]] = shard.all_gather %[[N]] on @dlopt_mesh grid_axes = [0] gather_axis = 1 {dlopt.layer = 0 : i64}
// CHECK: dlopt.matmul %[[G]], %{{.+}} {dlopt.layer = 0 : i64}
// CHECK: %[[DY:.+]] = shard.all_gather %{{.+}} gather_axis = 1 : tensor<2x4x8xf32>
// CHECK: %[[G2:.+]] = shard.all_gather %[[N]] on @dlopt_mesh grid_axes = [0] gather_axis = 1 {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NOT: %[[G]]{{[,) ]}}
// CHECK: dlopt.matmul %[[G2]], %{{.+}} {dlopt.backward, dlopt.layer = 0 : i64, transpose_a}
// CHECK: return

// Without recomputation the backward pass reads the forward's gather.
// NONE: %[[G:.+]] = shard.all_gather %{{.+}} {dlopt.layer = 0 : i64}
// NONE-NOT: dlopt.recompute
// NONE: dlopt.matmul %[[G]], %{{.+}} {dlopt.backward, dlopt.layer = 0 : i64, transpose_a}
func.func @main(%x: tensor<2x8x8xf32> {dlopt.input = "x", dlopt.sharding = [[], ["tp"], []]},
                %g: tensor<8xf32> {dlopt.param = "ln.weight"},
                %w1: tensor<8x16xf32> {dlopt.param = "w1", dlopt.sharding = [[], ["tp"]]},
                %w2: tensor<16x8xf32> {dlopt.param = "w2", dlopt.sharding = [["tp"], []]},
                %b2: tensor<8xf32> {dlopt.param = "b2"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %n = dlopt.layer_norm %x weight(%g) {axis = 2, dlopt.layer = 0 : i64} : (tensor<2x8x8xf32>, tensor<8xf32>) -> tensor<2x8x8xf32>
  %h = dlopt.matmul %n, %w1 {dlopt.layer = 0 : i64, dlopt.plan = {operands = [{split = [[], [], []], partial = []}, {split = [[], ["tp"]], partial = []}], results = [{split = [[], [], ["tp"]], partial = []}]}} : tensor<2x8x8xf32>, tensor<8x16xf32> -> tensor<2x8x16xf32>
  %a = dlopt.gelu %h {dlopt.layer = 0 : i64} : tensor<2x8x16xf32>
  %y = dlopt.matmul %a, %w2 {dlopt.layer = 0 : i64} : tensor<2x8x16xf32>, tensor<16x8xf32> -> tensor<2x8x8xf32>
  %yb = dlopt.add %y, %b2 {dlopt.layer = 0 : i64, dlopt.plan = {operands = [{split = [[], ["tp"], []], partial = []}, {split = [[]], partial = []}], results = [{split = [[], ["tp"], []], partial = []}]}} : tensor<2x8x8xf32>, tensor<8xf32> -> tensor<2x8x8xf32>
  %r = dlopt.add %x, %yb {dlopt.layer = 0 : i64} : tensor<2x8x8xf32>, tensor<2x8x8xf32> -> tensor<2x8x8xf32>
  %sq = dlopt.mul %r, %r : tensor<2x8x8xf32>, tensor<2x8x8xf32> -> tensor<2x8x8xf32>
  %l = dlopt.mean %sq dims = [0, 1, 2] : tensor<2x8x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// Context parallelism: the layer keeps its own keys and values, and the
// backward pass gathers them over cp again for attention_grad
// (Inputs/recompute-cp.mlir).
// CP: %[[K:.+]] = dlopt.matmul
// CP: %[[G:.+]] = shard.all_gather %[[K]] on @dlopt_mesh grid_axes = [0] gather_axis = 2 {dlopt.layer = 0 : i64}
// CP: dlopt.attention %{{.+}}, %[[G]], %[[G]]
// CP: %[[G2:.+]] = shard.all_gather %[[K]] on @dlopt_mesh grid_axes = [0] gather_axis = 2 {dlopt.layer = 0 : i64, dlopt.recompute}
// CP: dlopt.attention_grad %{{.+}}, %[[G2]], %[[G2]]
