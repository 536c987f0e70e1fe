// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=tp sizes=2" --dlopt-recompute="policy=elementwise" | FileCheck %s
// RUN: not dlopt-opt %s --dlopt-recompute="policy=cheap" 2>&1 | FileCheck %s --check-prefix=BAD

// Elementwise recomputation: before the layer's backward pass its norm
// (from the kept layer input), the sequence-parallel gather of the norm's
// output and the GELU (from the kept first matmul output) run again; the
// matmuls and the reduce-scatter do not, their results are kept.
// CHECK-LABEL: func.func @main
// CHECK: %[[MM1:.+]] = dlopt.matmul %{{.+}}, %{{.+}} {dlopt.layer = 0 : i64}
// CHECK: %[[N:.+]] = dlopt.layer_norm %arg0 weight(%arg1) {axis = 2 : i64, dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NEXT: %[[G:.+]] = shard.all_gather %[[N]] on @dlopt_mesh grid_axes = [0] gather_axis = 1 {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NEXT: %[[A:.+]] = dlopt.gelu %[[MM1]] {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NOT: dlopt.matmul {{.*}}dlopt.recompute
// CHECK-NOT: reduce_scatter {{.*}}dlopt.recompute
// CHECK-DAG: dlopt.matmul %[[A]], %{{.+}} {dlopt.backward, dlopt.layer = 0 : i64, transpose_a}
// CHECK-DAG: dlopt.matmul %[[G]], %{{.+}} {dlopt.backward, dlopt.layer = 0 : i64, transpose_a}
// CHECK: return

// BAD: dlopt-recompute: unknown policy 'cheap', expected none, selective, elementwise, alternate or full
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
