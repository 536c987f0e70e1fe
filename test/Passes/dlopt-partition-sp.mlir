// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=tp sizes=2" -canonicalize | FileCheck %s

// Sequence parallelism (Megatron-SP) as a plan states it: the block's input
// is split on the sequence over tp; `dlopt.plan` says the column-parallel
// matmul takes its input whole and the bias add takes the row-parallel
// partial sum split on the sequence. The forward pass all-gathers before
// the first matmul and reduce-scatters after the second; the backward pass
// all-gathers the output gradient once (for both of w2's gradients) and
// reduce-scatters the input gradient into the norm's region.
// CHECK-LABEL: func.func @main
// CHECK-SAME: %[[X:[^:]+]]: tensor<2x4x8xf32> {dlopt.global_type = tensor<2x8x8xf32>, dlopt.input = "x", dlopt.split = {{\[}}[], ["tp"], []]}
// CHECK: %[[N:.+]] = dlopt.layer_norm %[[X]]
// CHECK: %[[G:.+]] = shard.all_gather %[[N]] on @dlopt_mesh grid_axes = [0] gather_axis = 1{{( \{[^}]*\})?}} : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
// CHECK: dlopt.matmul %[[G]], %{{.+}} : tensor<2x8x8xf32>, tensor<8x8xf32> -> tensor<2x8x8xf32>
// CHECK: %[[Y:.+]] = dlopt.matmul %{{.+}}, %{{.+}} : tensor<2x8x8xf32>, tensor<8x8xf32> -> tensor<2x8x8xf32>
// CHECK: %[[RS:.+]] = shard.reduce_scatter %[[Y]] on @dlopt_mesh grid_axes = [0] scatter_axis = 1{{( \{[^}]*\})?}} : tensor<2x8x8xf32> -> tensor<2x4x8xf32>
// CHECK: dlopt.add %[[RS]], %{{.+}} : tensor<2x4x8xf32>, tensor<8xf32>
// CHECK: %[[DY:.+]] = shard.all_gather %{{.+}} on @dlopt_mesh grid_axes = [0] gather_axis = 1{{( \{[^}]*\})?}} : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
// CHECK-DAG: dlopt.matmul %[[DY]], %{{.+}} {dlopt.backward, transpose_b}
// CHECK-DAG: dlopt.matmul %{{.+}}, %[[DY]] {dlopt.backward, transpose_a}
// CHECK: %[[DX:.+]] = shard.reduce_scatter %{{.+}} on @dlopt_mesh grid_axes = [0] scatter_axis = 1{{( \{[^}]*\})?}} : tensor<2x8x8xf32> -> tensor<2x4x8xf32>
// CHECK: dlopt.layer_norm_grad %[[X]], %[[DX]]
func.func @main(%x: tensor<2x8x8xf32> {dlopt.input = "x", dlopt.sharding = [[], ["tp"], []]},
                %g: tensor<8xf32> {dlopt.param = "ln.weight"},
                %w1: tensor<8x16xf32> {dlopt.param = "w1", dlopt.sharding = [[], ["tp"]]},
                %w2: tensor<16x8xf32> {dlopt.param = "w2", dlopt.sharding = [["tp"], []]},
                %b2: tensor<8xf32> {dlopt.param = "b2"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %n = dlopt.layer_norm %x weight(%g) {axis = 2} : (tensor<2x8x8xf32>, tensor<8xf32>) -> tensor<2x8x8xf32>
  %h = dlopt.matmul %n, %w1 {dlopt.plan = {operands = [{split = [[], [], []], partial = []}, {split = [[], ["tp"]], partial = []}], results = [{split = [[], [], ["tp"]], partial = []}]}} : tensor<2x8x8xf32>, tensor<8x16xf32> -> tensor<2x8x16xf32>
  %a = dlopt.gelu %h : tensor<2x8x16xf32>
  %y = dlopt.matmul %a, %w2 : tensor<2x8x16xf32>, tensor<16x8xf32> -> tensor<2x8x8xf32>
  %yb = dlopt.add %y, %b2 {dlopt.plan = {operands = [{split = [[], ["tp"], []], partial = []}, {split = [[]], partial = []}], results = [{split = [[], ["tp"], []], partial = []}]}} : tensor<2x8x8xf32>, tensor<8xf32> -> tensor<2x8x8xf32>
  %r = dlopt.add %x, %yb : tensor<2x8x8xf32>, tensor<2x8x8xf32> -> tensor<2x8x8xf32>
  %sq = dlopt.mul %r, %r : tensor<2x8x8xf32>, tensor<2x8x8xf32> -> tensor<2x8x8xf32>
  %l = dlopt.mean %sq dims = [0, 1, 2] : tensor<2x8x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
