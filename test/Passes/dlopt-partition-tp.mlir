// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=dp,tp sizes=2,2" -canonicalize --verify-diagnostics | FileCheck %s

// A Megatron MLP block on a dp=2 x tp=2 mesh: w1 (and b1) column-parallel,
// w2 row-parallel. The forward pass all-reduces the row-parallel partial
// sum once over tp (grid axis 1); the backward pass needs no tp traffic;
// every weight gradient is summed over dp (grid axis 0) and leaves with its
// parameter's sharding.
// CHECK: module attributes {dlopt.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}}
// CHECK: shard.grid @dlopt_mesh(shape = 2x2)
// CHECK-LABEL: func.func @main
// CHECK-SAME: %[[X:[^:]+]]: tensor<2x8xf32> {dlopt.global_type = tensor<4x8xf32>, dlopt.input = "x", dlopt.split = {{\[}}["dp"], []]}
// CHECK-SAME: %[[W1:[^:]+]]: tensor<8x8xf32> {dlopt.global_type = tensor<8x16xf32>, dlopt.param = "w1", dlopt.split = {{\[}}[], ["tp"]]}
// CHECK-SAME: %[[B1:[^:]+]]: tensor<8xf32> {dlopt.global_type = tensor<16xf32>, dlopt.param = "b1", dlopt.split = {{\[}}["tp"]]}
// CHECK-SAME: %[[W2:[^:]+]]: tensor<8x8xf32> {dlopt.global_type = tensor<16x8xf32>, dlopt.param = "w2", dlopt.split = {{\[}}["tp"], []]}
// CHECK-SAME: -> (tensor<f32> {dlopt.output = "loss"}, tensor<8x8xf32> {dlopt.global_type = tensor<8x16xf32>, dlopt.grad = "w1", dlopt.output = "grad.w1", dlopt.split = {{\[}}[], ["tp"]]}
// CHECK: %[[H:.+]] = dlopt.matmul %[[X]], %[[W1]] : tensor<2x8xf32>, tensor<8x8xf32> -> tensor<2x8xf32>
// CHECK: dlopt.add %[[H]], %[[B1]] : tensor<2x8xf32>, tensor<8xf32>
// CHECK: %[[Y:.+]] = dlopt.matmul %{{.+}}, %[[W2]] : tensor<2x8xf32>, tensor<8x8xf32> -> tensor<2x8xf32>
// CHECK: %[[YR:.+]] = shard.all_reduce %[[Y]] on @dlopt_mesh grid_axes = [1]{{( \{[^}]*\})?}} : tensor<2x8xf32>
// CHECK: dlopt.mse %[[YR]]
// CHECK: shard.all_reduce %{{.+}} on @dlopt_mesh grid_axes = [0]{{( \{[^}]*\})?}} : tensor<f32>
// CHECK-NOT: grid_axes = [1]
// CHECK: return
func.func @main(%x: tensor<4x8xf32> {dlopt.input = "x"},
                %w1: tensor<8x16xf32> {dlopt.param = "w1", dlopt.sharding = [[], ["tp"]]},
                %b1: tensor<16xf32> {dlopt.param = "b1", dlopt.sharding = [["tp"]]},
                %w2: tensor<16x8xf32> {dlopt.param = "w2", dlopt.sharding = [["tp"], []]},
                %t: tensor<4x8xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w1 : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %hb = dlopt.add %h, %b1 : tensor<4x16xf32>, tensor<16xf32> -> tensor<4x16xf32>
  %a = dlopt.gelu %hb : tensor<4x16xf32>
  %y = dlopt.matmul %a, %w2 : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
  %l = dlopt.mse %y, %t : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Vocabulary parallelism with a tied embedding: the table is split on its
// rows over tp. The lookup subtracts this rank's first row (its block of
// [0, 8]), clamps, and zeroes ids outside the block: a partial sum. The
// LM head gives logits split on the classes; cross-entropy reduces the row
// max (max), the sum of exponentials and the target logit over tp, and
// compares labels with this rank's block of the class ids. The embedding
// gradient is scattered into this rank's rows only (ids outside its block
// masked out): no [16, 8] table is built.
// CHECK-LABEL: func.func @main
// CHECK-SAME: tensor<8x8xf32> {dlopt.global_type = tensor<16x8xf32>, dlopt.param = "wte", dlopt.split = {{\[}}["tp"], []]}
// CHECK: %[[STARTS:.+]] = arith.constant dense<[0, 8]> : tensor<2xi32>
// CHECK: %[[IOTA:.+]] = dlopt.iota dim = 0 : tensor<16xi32>
// CHECK: %[[CLS:.+]] = shard.all_slice %[[IOTA]] on @dlopt_mesh grid_axes = [1] slice_axis = 0{{( \{[^}]*\})?}} : tensor<16xi32> -> tensor<8xi32>
// CHECK: shard.all_slice %[[STARTS]] on @dlopt_mesh grid_axes = [1] slice_axis = 0{{( \{[^}]*\})?}} : tensor<2xi32> -> tensor<1xi32>
// CHECK: %[[ROWS:.+]] = dlopt.gather
// CHECK: %[[MASKED:.+]] = dlopt.select %{{.+}}, %[[ROWS]]
// CHECK: %[[LOOKUP:.+]] = dlopt.reshape %[[MASKED]] : tensor<2x4x8xf32> -> tensor<8x8xf32>
// CHECK: shard.all_reduce %[[LOOKUP]] on @dlopt_mesh grid_axes = [1]
// CHECK: %[[LOGITS:.+]] = dlopt.matmul {{.+}} {transpose_b} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK: %[[M:.+]] = dlopt.max %[[LOGITS]] dims = [1] keepdims
// CHECK: shard.all_reduce %[[M]] on @dlopt_mesh grid_axes = [1] reduction = max
// CHECK: dlopt.compare eq, %[[CLS]]
// CHECK-NOT: dlopt.cross_entropy
// CHECK: dlopt.scatter_add {{.+}} -> tensor<8x8xf32>
func.func @main(%ids: tensor<4x4xi32> {dlopt.input = "tokens"},
                %labels: tensor<16xi32> {dlopt.input = "labels"},
                %wte: tensor<16x8xf32> {dlopt.param = "wte", dlopt.sharding = [["tp"], []]})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %e = dlopt.gather %wte, %ids {dlopt.id = 0 : i64} : tensor<16x8xf32>, tensor<4x4xi32> -> tensor<4x4x8xf32>
  %e2 = dlopt.reshape %e : tensor<4x4x8xf32> -> tensor<16x8xf32>
  %logits = dlopt.matmul %e2, %wte {transpose_b} : tensor<16x8xf32>, tensor<16x8xf32> -> tensor<16x16xf32>
  %l = dlopt.cross_entropy %logits, %labels : tensor<16x16xf32>, tensor<16xi32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Attention split on the head dim D (nothing attends over a part of D).
func.func @main(%q: tensor<2x4x8x4xf32> {dlopt.input = "q", dlopt.sharding = [["dp"], [], [], ["tp"]]},
                %w: tensor<1x4x8x4xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %k = dlopt.mul %q, %w : tensor<2x4x8x4xf32>, tensor<1x4x8x4xf32> -> tensor<2x4x8x4xf32>
  // expected-error @+1 {{'dlopt.attention' op has no rule for operand shardings (S3, S3, S3) over mesh axis 'tp' (2 ranks): only the batch (0) or the heads (1) of q, k and v may be split, or the queries' sequence (2)}}
  %o = dlopt.attention %k, %k, %k {causal} : tensor<2x4x8x4xf32>, tensor<2x4x8x4xf32>, tensor<2x4x8x4xf32> -> tensor<2x4x8x4xf32>
  %l = dlopt.sum %o dims = [0, 1, 2, 3] : tensor<2x4x8x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Grouped-query attention with fewer key/value heads than tp ranks: the
// queries' heads split, the one key/value head cannot (Megatron would
// replicate it; dlopt refuses, and the planner never proposes such a tp).
func.func @main(%q: tensor<2x2x8x4xf32> {dlopt.input = "q", dlopt.sharding = [[], ["tp"], [], []]},
                %kv: tensor<2x1x8x4xf32> {dlopt.input = "kv"},
                %w: tensor<4xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %k = dlopt.mul %kv, %w : tensor<2x1x8x4xf32>, tensor<4xf32> -> tensor<2x1x8x4xf32>
  // expected-error @+1 {{'dlopt.attention' op has no rule for operand shardings (S1, R, R) over mesh axis 'tp' (2 ranks): dim 1 of an operand does not divide by the axis}}
  %o = dlopt.attention %q, %k, %k {causal} : tensor<2x2x8x4xf32>, tensor<2x1x8x4xf32>, tensor<2x1x8x4xf32> -> tensor<2x2x8x4xf32>
  %l = dlopt.sum %o dims = [0, 1, 2, 3] : tensor<2x2x8x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{dlopt-partition: argument #1 ('tensor<4x6xf32>'): dim 1 (6) does not divide by 4, the ranks of the axes that split it}}
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"},
                %w: tensor<4x6xf32> {dlopt.param = "w", dlopt.sharding = [[], ["dp", "tp"]]})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<4x4xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  %l = dlopt.sum %h dims = [0, 1] : tensor<4x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{dlopt-partition: argument #1: dlopt.sharding names "pp", which is not a mesh axis}}
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w", dlopt.sharding = [[], ["pp"]]})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %l = dlopt.sum %h dims = [0, 1] : tensor<4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{dlopt-partition: argument #1: axis 'tp' splits two dims}}
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w", dlopt.sharding = [["tp"], ["tp"]]})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %l = dlopt.sum %h dims = [0, 1] : tensor<4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{dlopt-partition: argument #1: dim 1 lists its axes out of mesh order}}
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"},
                %w: tensor<4x8xf32> {dlopt.param = "w", dlopt.sharding = [[], ["tp", "dp"]]})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<4x4xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %l = dlopt.sum %h dims = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Convolution filters split on their output channels (tensor parallelism
// over channels): no rule yet, refused by name.
func.func @main(%x: tensor<2x1x6x6xf32> {dlopt.input = "x"},
                %w: tensor<4x1x3x3xf32> {dlopt.param = "w", dlopt.sharding = [["tp"], [], [], []]})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  // expected-error @+1 {{'dlopt.conv2d' op has no rule for operand shardings (R, S0) over mesh axis 'tp' (2 ranks): only the batch dim (0) of the activations may be split, with whole filters and biases}}
  %y = dlopt.conv2d %x, %w : (tensor<2x1x6x6xf32>, tensor<4x1x3x3xf32>) -> tensor<2x4x4x4xf32>
  %l = dlopt.sum %y dims = [0, 1, 2, 3] : tensor<2x4x4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
