// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --verify-diagnostics | FileCheck %s

// MSE regression: inputs split on the batch, the loss and every weight
// gradient summed over dp, mse's local mean scaled by 1/dp.
// CHECK: module attributes {dlopt.mesh = {axes = ["dp"], shape = array<i64: 2>}}
// CHECK: shard.grid @dlopt_mesh(shape = 2)
// CHECK-LABEL: func.func @main
// CHECK-SAME: %[[X:.+]]: tensor<4x4xf32> {dlopt.global_type = tensor<8x4xf32>, dlopt.input = "x", dlopt.split = {{\[}}["dp"], []]}
// CHECK-SAME: %[[W:.+]]: tensor<4x3xf32> {dlopt.param = "w"}
// CHECK: %[[H:.+]] = dlopt.matmul %[[X]], %[[W]] : tensor<4x4xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
// CHECK: %[[L:.+]] = dlopt.mse %[[H]]
// CHECK: %[[LS:.+]] = dlopt.mul %[[L]], %{{.+}} : tensor<f32>
// CHECK: %[[LR:.+]] = shard.all_reduce %[[LS]] on @dlopt_mesh grid_axes = [0]
// CHECK: %[[G:.+]] = dlopt.matmul %[[X]], %{{.+}} {dlopt.backward, transpose_a} : tensor<4x4xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
// CHECK: %[[GR:.+]] = shard.all_reduce %[[G]] on @dlopt_mesh grid_axes = [0]
// CHECK: return %[[LR]], %[[GR]]
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"},
                %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %l = dlopt.mse %h, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Cross-entropy divides by the global number of valid rows: local count /
// max(all_reduce(local count), 1) scales the loss and its gradient.
// CHECK-LABEL: func.func @main
// CHECK: %[[VALID:.+]] = dlopt.compare ne
// CHECK: %[[CNT:.+]] = dlopt.sum
// CHECK: %[[ALL:.+]] = shard.all_reduce %[[CNT]]
// CHECK: %[[DEN:.+]] = dlopt.maximum %[[ALL]]
// CHECK: %[[SCALE:.+]] = dlopt.div %[[CNT]], %[[DEN]]
// CHECK: %[[CE:.+]] = dlopt.cross_entropy
// CHECK: dlopt.mul %[[CE]], %[[SCALE]]
// CHECK: %[[CEG:.+]] = dlopt.cross_entropy_grad
// CHECK: dlopt.mul %[[CEG]], %[[SCALE]]
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %y: tensor<8xi32> {dlopt.input = "labels"},
                %w: tensor<4x5xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x5xf32> -> tensor<8x5xf32>
  %l = dlopt.cross_entropy %h, %y : tensor<8x5xf32>, tensor<8xi32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A batch that does not divide by dp is refused.
// expected-error @+1 {{dlopt-partition: argument #0 ('tensor<3x4xf32>') cannot be split over dp = 2: its dim 0 (3 here) must be a multiple of 2}}
func.func @main(%x: tensor<3x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<3x4xf32>, tensor<4x3xf32> -> tensor<3x3xf32>
  %l = dlopt.sum %h dims = [0, 1] : tensor<3x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Batch norm with the batch split is synchronized: the statistics are
// summed over dp, the op runs in inference form on them, and the running
// statistics follow from the global ones.
// CHECK-LABEL: func.func @main
// CHECK: %[[S1:.+]] = dlopt.sum %{{.+}} dims = [0, 2, 3] : tensor<4x4x6x6xf32> -> tensor<4xf32>
// CHECK: %[[S1R:.+]] = shard.all_reduce %[[S1]] on @dlopt_mesh grid_axes = [0]
// CHECK: %[[MEAN:.+]] = dlopt.mul %[[S1R]]
// CHECK: %[[S2R:.+]] = shard.all_reduce %{{.+}} on @dlopt_mesh grid_axes = [0]{{( \{[^}]*\})?}} : tensor<4xf32>
// CHECK: %[[VAR:.+]] = dlopt.mul %[[S2R]]
// CHECK: dlopt.batch_norm %{{.+}}, %{{.+}}, %{{.+}}, %[[MEAN]], %[[VAR]] : (tensor<4x4x6x6xf32>
// CHECK: dlopt.batch_norm_grad %{{.+}}, %{{.+}}, %[[MEAN]], %[[VAR]], %{{.+}} : (tensor<4x4x6x6xf32>
func.func @main(%x: tensor<8x4x6x6xf32> {dlopt.input = "x"},
                %w: tensor<4xf32> {dlopt.param = "w"}, %b: tensor<4xf32> {dlopt.param = "b"},
                %m: tensor<4xf32> {dlopt.state = "m"}, %v: tensor<4xf32> {dlopt.state = "v"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %y, %mean, %var = dlopt.batch_norm %x, %w, %b, %m, %v {training} : (tensor<8x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>)
  %l = dlopt.mean %y dims = [0, 1, 2, 3] : tensor<8x4x6x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Dropout masks do not depend on the split: the mask is drawn for the whole
// batch (global element indices) and each rank keeps its block.
// CHECK-LABEL: func.func @main
// CHECK: %[[ONES:.+]] = arith.constant dense<1.000000e+00> : tensor<8x4xf32>
// CHECK: %[[MASK:.+]] = dlopt.dropout %[[ONES]] {rate = 5.000000e-01 : f64, seed = 1 : i64} : tensor<8x4xf32>
// CHECK: %[[MINE:.+]] = shard.all_slice %[[MASK]] on @dlopt_mesh grid_axes = [0] slice_axis = 0{{( \{[^}]*\})?}} : tensor<8x4xf32> -> tensor<4x4xf32>
// CHECK: dlopt.mul %{{.+}}, %[[MINE]] : tensor<4x4xf32>, tensor<4x4xf32>
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %d = dlopt.dropout %h {rate = 0.5 : f64, seed = 1 : i64} : tensor<8x4xf32>
  %l = dlopt.mean %d dims = [0, 1] : tensor<8x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// An op without a rule for what it meets is refused, naming the op, the
// axis and the shardings.
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  // expected-error @+1 {{'dlopt.slice' op has no rule for operand shardings (S0) over mesh axis 'dp' (2 ranks): this op has no partitioning rule yet}}
  %d = dlopt.slice %h start = [0, 0] limit = [4, 4] stride = [1, 1] : tensor<8x4xf32> -> tensor<4x4xf32>
  %l = dlopt.mean %d dims = [0, 1] : tensor<4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A filter gradient whose dy is whole (the gradient of a loss summed over
// the whole batch) beside a batch-split x: dy takes the rank's block (a
// slice, no traffic) and the partial filter gradient is all-reduced.
// CHECK-LABEL: func.func @main
// CHECK: %[[DY:.+]] = shard.all_slice %{{.+}} on @dlopt_mesh grid_axes = [0] slice_axis = 0{{( \{[^}]*\})?}} : tensor<2x4x4x4xf32> -> tensor<1x4x4x4xf32>
// CHECK: %[[DW:.+]] = dlopt.conv2d_grad_filter %arg0, %[[DY]] {dlopt.backward} : (tensor<1x1x6x6xf32>, tensor<1x4x4x4xf32>) -> tensor<4x1x3x3xf32>
// CHECK: shard.all_reduce %[[DW]] on @dlopt_mesh grid_axes = [0]{{( \{[^}]*\})?}} : tensor<4x1x3x3xf32>
func.func @main(%x: tensor<2x1x6x6xf32> {dlopt.input = "x"},
                %w: tensor<4x1x3x3xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %y = dlopt.conv2d %x, %w : (tensor<2x1x6x6xf32>, tensor<4x1x3x3xf32>) -> tensor<2x4x4x4xf32>
  %l = dlopt.sum %y dims = [0, 1, 2, 3] : tensor<2x4x4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
