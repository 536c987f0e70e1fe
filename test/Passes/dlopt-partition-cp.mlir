// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=cp sizes=2" -canonicalize | FileCheck %s

// Context parallelism, the all-gather form: queries stay split on the
// sequence, keys and values are gathered, and each rank's causal mask starts
// at its block: offset = (T - S) + rank * S_local, here [0, 4][rank].
// The key and value gradients are partial (each rank's queries' share) and
// reduce-scattered back onto the sequence for their owners.
// CHECK-LABEL: func.func @main
// CHECK: %[[STARTS:.+]] = arith.constant dense<[0, 4]> : tensor<2xi64>
// CHECK: %[[K:.+]] = shard.all_gather %{{.+}} on @dlopt_mesh grid_axes = [0] gather_axis = 2{{( \{[^}]*\})?}} : tensor<1x2x4x8xf32> -> tensor<1x2x8x8xf32>
// CHECK: %[[MINE:.+]] = shard.all_slice %[[STARTS]] on @dlopt_mesh grid_axes = [0] slice_axis = 0{{( \{[^}]*\})?}} : tensor<2xi64> -> tensor<1xi64>
// CHECK: %[[OFF:.+]] = dlopt.reshape %[[MINE]] : tensor<1xi64> -> tensor<i64>
// CHECK: dlopt.attention %{{.+}}, %[[K]], %[[K]] offset(%[[OFF]] : tensor<i64>) {causal} : tensor<1x2x4x8xf32>, tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32> -> tensor<1x2x4x8xf32>
// CHECK: dlopt.attention_grad {{.+}} offset(%{{.+}}) {causal, dlopt.backward}
// CHECK: shard.reduce_scatter {{.+}} scatter_axis = 2 {{.*}}: tensor<1x2x8x8xf32> -> tensor<1x2x4x8xf32>
func.func @main(%x: tensor<1x2x8x8xf32> {dlopt.input = "x", dlopt.sharding = [[], [], ["cp"], []]},
                %wk: tensor<8x8xf32> {dlopt.param = "wk"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %k = dlopt.matmul %x, %wk : tensor<1x2x8x8xf32>, tensor<8x8xf32> -> tensor<1x2x8x8xf32>
  %o = dlopt.attention %x, %k, %k {causal} : tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32> -> tensor<1x2x8x8xf32>
  %sq = dlopt.mul %o, %o : tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32> -> tensor<1x2x8x8xf32>
  %l = dlopt.sum %sq dims = [0, 1, 2, 3] : tensor<1x2x8x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Rope over sequence-split rows: positions start at the rank's block.
// CHECK-LABEL: func.func @main
// CHECK: %[[STARTS:.+]] = arith.constant dense<[0, 4]> : tensor<2xi64>
// CHECK: %[[MINE:.+]] = shard.all_slice %[[STARTS]]
// CHECK: %[[BASE:.+]] = dlopt.reshape %[[MINE]] : tensor<1xi64> -> tensor<i64>
// CHECK: dlopt.rope %{{.+}} offset(%[[BASE]] : tensor<i64>) : tensor<1x2x4x8xf32>
// CHECK: dlopt.rope %{{.+}} offset(%{{.+}} : tensor<i64>) {dlopt.backward, inverse} : tensor<1x2x4x8xf32>
func.func @main(%x: tensor<1x2x8x8xf32> {dlopt.input = "x", dlopt.sharding = [[], [], ["cp"], []]},
                %w: tensor<8xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %y = dlopt.mul %x, %w : tensor<1x2x8x8xf32>, tensor<8xf32> -> tensor<1x2x8x8xf32>
  %r = dlopt.rope %y : tensor<1x2x8x8xf32>
  %sq = dlopt.mul %r, %r : tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32> -> tensor<1x2x8x8xf32>
  %l = dlopt.sum %sq dims = [0, 1, 2, 3] : tensor<1x2x8x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Key and value projections: each gradient is reduce-scattered once, and
// that one collective serves both its weight gradient and the projection's
// input gradient (computed on the rank's rows: no third reduce-scatter).
// The weights are replicated over cp, so their gradients are all-reduced.
// CHECK-LABEL: func.func @main
// CHECK: dlopt.attention_grad
// CHECK-NEXT: %[[DK:.+]] = shard.reduce_scatter %key_grad {{.+}} scatter_axis = 2 {{.*}}: tensor<1x1x8x8xf32> -> tensor<1x1x4x8xf32>
// CHECK-NEXT: %[[DV:.+]] = shard.reduce_scatter %value_grad {{.+}} scatter_axis = 2
// CHECK-NOT: shard.reduce_scatter
// CHECK-DAG: dlopt.matmul %[[DV]], %{{.+}} {dlopt.backward, transpose_b} : tensor<1x1x4x8xf32>, tensor<8x8xf32> -> tensor<1x1x4x8xf32>
// CHECK-DAG: dlopt.matmul %[[DK]], %{{.+}} {dlopt.backward, transpose_b} : tensor<1x1x4x8xf32>, tensor<8x8xf32> -> tensor<1x1x4x8xf32>
// CHECK-DAG: dlopt.matmul %{{.+}}, %[[DK]] {dlopt.backward, transpose_a}
// CHECK-DAG: dlopt.matmul %{{.+}}, %[[DV]] {dlopt.backward, transpose_a}
// CHECK: return
func.func @main(%x: tensor<1x1x8x8xf32> {dlopt.input = "x", dlopt.sharding = [[], [], ["cp"], []]},
                %wk: tensor<8x8xf32> {dlopt.param = "wk"},
                %wv: tensor<8x8xf32> {dlopt.param = "wv"},
                %s: tensor<8xf32> {dlopt.param = "s"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.mul %x, %s : tensor<1x1x8x8xf32>, tensor<8xf32> -> tensor<1x1x8x8xf32>
  %k = dlopt.matmul %h, %wk : tensor<1x1x8x8xf32>, tensor<8x8xf32> -> tensor<1x1x8x8xf32>
  %v = dlopt.matmul %h, %wv : tensor<1x1x8x8xf32>, tensor<8x8xf32> -> tensor<1x1x8x8xf32>
  %o = dlopt.attention %h, %k, %v {causal} : tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32> -> tensor<1x1x8x8xf32>
  %sq = dlopt.mul %o, %o : tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32> -> tensor<1x1x8x8xf32>
  %l = dlopt.sum %sq dims = [0, 1, 2, 3] : tensor<1x1x8x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
