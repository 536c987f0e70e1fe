// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd" | FileCheck %s
// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd bucket-mb=0" | FileCheck %s --check-prefix=NONE
// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd bucket-mb=0.00004" | FileCheck %s --check-prefix=SMALL

// The gradients' all-reduces over dp are fused into one bucket, in
// backward order (b's gradient is complete first, then w's): flattened,
// concatenated, all-reduced where the last is complete, and sliced back;
// every op of the bucket carries the reduction's marks (backward here; the
// micro-batch too, which a pipeline schedules by).
// CHECK-LABEL: func.func @main
// CHECK: %[[GB:.+]] = dlopt.sum %{{.+}} dims = [0] {dlopt.backward} : tensor<4x3xf32> -> tensor<3xf32>
// CHECK: %[[GW:.+]] = dlopt.matmul %{{.+}} {dlopt.backward, transpose_a} : tensor<4x4xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
// CHECK: %[[FW:.+]] = dlopt.reshape %[[GW]] {dlopt.backward} : tensor<4x3xf32> -> tensor<12xf32>
// CHECK: %[[CAT:.+]] = dlopt.concat %[[GB]], %[[FW]] dim = 0 {dlopt.backward} : tensor<3xf32>, tensor<12xf32> -> tensor<15xf32>
// CHECK: %[[SUM:.+]] = shard.all_reduce %[[CAT]] on @dlopt_mesh grid_axes = [0] {dlopt.backward} : tensor<15xf32> -> tensor<15xf32>
// CHECK: dlopt.slice %[[SUM]] start = [0] limit = [3] stride = [1] {dlopt.backward} : tensor<15xf32> -> tensor<3xf32>
// CHECK: %[[SW:.+]] = dlopt.slice %[[SUM]] start = [3] limit = [15] stride = [1] {dlopt.backward} : tensor<15xf32> -> tensor<12xf32>
// CHECK: dlopt.reshape %[[SW]] {dlopt.backward} : tensor<12xf32> -> tensor<4x3xf32>
// CHECK-NOT: shard.all_reduce {{.+}} tensor<4x3xf32>

// bucket-mb=0: one all-reduce per gradient.
// NONE-NOT: dlopt.concat
// NONE: shard.all_reduce {{.+}} : tensor<3xf32> -> tensor<3xf32>
// NONE: shard.all_reduce {{.+}} : tensor<4x3xf32> -> tensor<4x3xf32>

// A bucket smaller than both gradients (about 42 bytes) holds one each.
// SMALL-NOT: dlopt.concat
// SMALL: shard.all_reduce {{.+}} : tensor<3xf32> -> tensor<3xf32>
// SMALL: shard.all_reduce {{.+}} : tensor<4x3xf32> -> tensor<4x3xf32>
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"},
                %b: tensor<3xf32> {dlopt.param = "b"},
                %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %hb = dlopt.add %h, %b : tensor<8x3xf32>, tensor<3xf32> -> tensor<8x3xf32>
  %l = dlopt.mse %hb, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}
