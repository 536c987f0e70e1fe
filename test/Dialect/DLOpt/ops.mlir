// RUN: dlopt-opt %s | dlopt-opt | FileCheck %s
// RUN: dlopt-opt %s --mlir-print-op-generic | dlopt-opt | FileCheck %s

// CHECK-LABEL: func @unary
func.func @unary(%x: tensor<4x8xf32>, %i: tensor<4xi32>, %h: tensor<4xbf16>) -> tensor<4x8xf32> {
  // CHECK: dlopt.neg %{{.*}} : tensor<4x8xf32>
  %0 = dlopt.neg %x : tensor<4x8xf32>
  // CHECK: dlopt.abs %{{.*}} : tensor<4xi32>
  %1 = dlopt.abs %i : tensor<4xi32>
  // CHECK: dlopt.exp
  %2 = dlopt.exp %0 : tensor<4x8xf32>
  // CHECK: dlopt.log
  %3 = dlopt.log %2 : tensor<4x8xf32>
  // CHECK: dlopt.sqrt
  %4 = dlopt.sqrt %3 : tensor<4x8xf32>
  // CHECK: dlopt.rsqrt
  %5 = dlopt.rsqrt %4 : tensor<4x8xf32>
  // CHECK: dlopt.tanh
  %6 = dlopt.tanh %5 : tensor<4x8xf32>
  // CHECK: dlopt.sigmoid
  %7 = dlopt.sigmoid %6 : tensor<4x8xf32>
  // CHECK: dlopt.relu
  %8 = dlopt.relu %7 : tensor<4x8xf32>
  // CHECK: dlopt.gelu %{{.*}} : tensor<4x8xf32>
  %9 = dlopt.gelu %8 : tensor<4x8xf32>
  // CHECK: dlopt.gelu %{{.*}} {approximate = "tanh"} : tensor<4x8xf32>
  %10 = dlopt.gelu %9 {approximate = "tanh"} : tensor<4x8xf32>
  // CHECK: dlopt.silu
  %11 = dlopt.silu %10 : tensor<4x8xf32>
  // CHECK: dlopt.sin
  %12 = dlopt.sin %11 : tensor<4x8xf32>
  // CHECK: dlopt.cos
  %13 = dlopt.cos %12 : tensor<4x8xf32>
  // CHECK: dlopt.cast %{{.*}} : tensor<4xbf16> -> tensor<4xi64>
  %14 = dlopt.cast %h : tensor<4xbf16> -> tensor<4xi64>
  // CHECK: dlopt.relu %{{.*}} : tensor<4xi32>
  %15 = dlopt.relu %1 : tensor<4xi32>
  return %13 : tensor<4x8xf32>
}

// CHECK-LABEL: func @binary
func.func @binary(%a: tensor<4x8xf32>, %b: tensor<8xf32>, %c: tensor<4x1xi64>, %d: tensor<3xi64>) -> tensor<4x8xf32> {
  // CHECK: dlopt.add %{{.*}}, %{{.*}} : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  %0 = dlopt.add %a, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  // CHECK: dlopt.sub
  %1 = dlopt.sub %0, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  // CHECK: dlopt.mul
  %2 = dlopt.mul %b, %1 : tensor<8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: dlopt.div
  %3 = dlopt.div %2, %a : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: dlopt.maximum
  %4 = dlopt.maximum %3, %a : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: dlopt.minimum
  %5 = dlopt.minimum %4, %a : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: dlopt.pow
  %6 = dlopt.pow %5, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  // CHECK: dlopt.add %{{.*}}, %{{.*}} : tensor<4x1xi64>, tensor<3xi64> -> tensor<4x3xi64>
  %7 = dlopt.add %c, %d : tensor<4x1xi64>, tensor<3xi64> -> tensor<4x3xi64>
  // CHECK: dlopt.compare ge, %{{.*}}, %{{.*}} : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xi1>
  %8 = dlopt.compare ge, %6, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xi1>
  // CHECK: dlopt.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<4x8xi1>, tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  %9 = dlopt.select %8, %6, %b : tensor<4x8xi1>, tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  return %9 : tensor<4x8xf32>
}

// CHECK-LABEL: func @reductions
func.func @reductions(%x: tensor<2x3x4xf32>, %i: tensor<5x6xi32>) -> (tensor<2x1x1xf32>, tensor<3xf32>, tensor<5xi32>, tensor<2x3x4xf32>) {
  // CHECK: dlopt.sum %{{.*}} dims = [1, 2] keepdims : tensor<2x3x4xf32> -> tensor<2x1x1xf32>
  %0 = dlopt.sum %x dims = [1, 2] keepdims : tensor<2x3x4xf32> -> tensor<2x1x1xf32>
  // CHECK: dlopt.mean %{{.*}} dims = [0, -1] : tensor<2x3x4xf32> -> tensor<3xf32>
  %1 = dlopt.mean %x dims = [0, -1] : tensor<2x3x4xf32> -> tensor<3xf32>
  // CHECK: dlopt.max %{{.*}} dims = [1] : tensor<5x6xi32> -> tensor<5xi32>
  %2 = dlopt.max %i dims = [1] : tensor<5x6xi32> -> tensor<5xi32>
  // CHECK: dlopt.sum %{{.*}} dims = [] : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %3 = dlopt.sum %x dims = [] : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  return %0, %1, %2, %3 : tensor<2x1x1xf32>, tensor<3xf32>, tensor<5xi32>, tensor<2x3x4xf32>
}

// CHECK-LABEL: func @matmul
func.func @matmul(%a: tensor<2x4x8xbf16>, %b: tensor<16x8xbf16>, %c: tensor<3x1x8x4xf32>, %d: tensor<5x8x6xf32>) -> (tensor<2x4x16xbf16>, tensor<3x5x4x6xf32>) {
  // CHECK: dlopt.matmul %{{.*}}, %{{.*}} {transpose_b} : tensor<2x4x8xbf16>, tensor<16x8xbf16> -> tensor<2x4x16xbf16>
  %0 = dlopt.matmul %a, %b {transpose_b} : tensor<2x4x8xbf16>, tensor<16x8xbf16> -> tensor<2x4x16xbf16>
  // CHECK: dlopt.matmul %{{.*}}, %{{.*}} {transpose_a} : tensor<3x1x8x4xf32>, tensor<5x8x6xf32> -> tensor<3x5x4x6xf32>
  %1 = dlopt.matmul %c, %d {transpose_a} : tensor<3x1x8x4xf32>, tensor<5x8x6xf32> -> tensor<3x5x4x6xf32>
  return %0, %1 : tensor<2x4x16xbf16>, tensor<3x5x4x6xf32>
}

// CHECK-LABEL: func @shapes
func.func @shapes(%x: tensor<4x8xf32>, %y: tensor<1x8xf32>, %ids: tensor<2x5xi64>, %t: tensor<100x16xf16>) -> tensor<2x5x16xf16> {
  // CHECK: dlopt.reshape %{{.*}} : tensor<4x8xf32> -> tensor<2x16xf32>
  %0 = dlopt.reshape %x : tensor<4x8xf32> -> tensor<2x16xf32>
  // CHECK: dlopt.transpose %{{.*}} perm = [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %1 = dlopt.transpose %x perm = [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  // CHECK: dlopt.broadcast_to %{{.*}} : tensor<1x8xf32> -> tensor<3x4x8xf32>
  %2 = dlopt.broadcast_to %y : tensor<1x8xf32> -> tensor<3x4x8xf32>
  // CHECK: dlopt.concat %{{.*}}, %{{.*}} dim = 0 : tensor<4x8xf32>, tensor<1x8xf32> -> tensor<5x8xf32>
  %3 = dlopt.concat %x, %y dim = 0 : tensor<4x8xf32>, tensor<1x8xf32> -> tensor<5x8xf32>
  // CHECK: dlopt.slice %{{.*}} start = [0, 1] limit = [4, 8] stride = [2, 3] : tensor<4x8xf32> -> tensor<2x3xf32>
  %4 = dlopt.slice %x start = [0, 1] limit = [4, 8] stride = [2, 3] : tensor<4x8xf32> -> tensor<2x3xf32>
  // CHECK: dlopt.gather %{{.*}}, %{{.*}} : tensor<100x16xf16>, tensor<2x5xi64> -> tensor<2x5x16xf16>
  %5 = dlopt.gather %t, %ids : tensor<100x16xf16>, tensor<2x5xi64> -> tensor<2x5x16xf16>
  // CHECK: dlopt.iota dim = 1 : tensor<3x16xi32>
  %6 = dlopt.iota dim = 1 : tensor<3x16xi32>
  return %5 : tensor<2x5x16xf16>
}

// CHECK-LABEL: func @nn
func.func @nn(%x: tensor<2x4x8xf32>, %w: tensor<8xf32>, %q: tensor<2x4x16x8xf32>, %k: tensor<2x2x16x8xf32>, %v: tensor<2x2x16x6xf32>) -> tensor<2x4x16x6xf32> {
  // CHECK: dlopt.softmax %{{.*}} dim = 2 : tensor<2x4x8xf32>
  %0 = dlopt.softmax %x dim = 2 : tensor<2x4x8xf32>
  // CHECK: dlopt.log_softmax %{{.*}} dim = -1 : tensor<2x4x8xf32>
  %1 = dlopt.log_softmax %x dim = -1 : tensor<2x4x8xf32>
  // CHECK: dlopt.layer_norm %{{.*}} weight(%{{.*}}) bias(%{{.*}}) {eps = 9.9999999999999995E-7 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %2 = dlopt.layer_norm %x weight(%w) bias(%w) {eps = 1.0e-06} : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK: dlopt.layer_norm %{{.*}} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %3 = dlopt.layer_norm %x : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  // CHECK: dlopt.layer_norm %{{.*}} bias(%{{.*}}) {axis = 2 : i64} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %4 = dlopt.layer_norm %x bias(%w) {axis = 2} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK: dlopt.rms_norm %{{.*}} weight(%{{.*}}) : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %5 = dlopt.rms_norm %x weight(%w) : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK: dlopt.rope %{{.*}} {theta = 5.000000e+05 : f64} : tensor<2x4x16x8xf32>
  %6 = dlopt.rope %q {theta = 500000.0} : tensor<2x4x16x8xf32>
  // CHECK: dlopt.attention %{{.*}}, %{{.*}}, %{{.*}} {causal, scale = 1.250000e-01 : f64} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x6xf32> -> tensor<2x4x16x6xf32>
  %7 = dlopt.attention %6, %k, %v {causal, scale = 0.125} : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x6xf32> -> tensor<2x4x16x6xf32>
  // CHECK: dlopt.dropout %{{.*}} {rate = 1.000000e-01 : f64, seed = 7 : i64} : tensor<2x4x16x6xf32>
  %8 = dlopt.dropout %7 {rate = 0.1, seed = 7} : tensor<2x4x16x6xf32>
  return %8 : tensor<2x4x16x6xf32>
}

// CHECK-LABEL: func @dropout_offset
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<4x8xf32>, %[[S:[a-z0-9]+]]: tensor<i64>, %[[T:[a-z0-9]+]]: tensor<i32>
func.func @dropout_offset(%x: tensor<4x8xf32>, %s: tensor<i64>, %t: tensor<i32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  // CHECK: dlopt.dropout %[[X]] offset(%[[S]] : tensor<i64>) {rate = 1.000000e-01 : f64, seed = 42 : i64} : tensor<4x8xf32>
  %0 = dlopt.dropout %x offset(%s : tensor<i64>) {rate = 0.1, seed = 42} : tensor<4x8xf32>
  // CHECK: dlopt.dropout %[[X]] offset(%[[T]] : tensor<i32>) {rate = 5.000000e-01 : f64, seed = -3 : i64} : tensor<4x8xf32>
  %1 = dlopt.dropout %x offset(%t : tensor<i32>) {rate = 0.5, seed = -3} : tensor<4x8xf32>
  // CHECK: dlopt.dropout %[[X]] {rate = 2.500000e-01 : f64, seed = 1 : i64} : tensor<4x8xf32>
  %2 = "dlopt.dropout"(%x) {rate = 0.25 : f64, seed = 1 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0, %1, %2 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// CHECK-LABEL: func @conv
func.func @conv(%x: tensor<2x4x9x9xf32>, %w: tensor<8x2x3x3xf32>, %b: tensor<8xf32>, %s: tensor<8xf32>) -> (tensor<2x8x5x5xf32>, tensor<8xf32>) {
  // CHECK: dlopt.conv2d %{{.*}}, %{{.*}} bias(%{{.*}}) {groups = 2 : i64, padding = array<i64: 1, 1>, stride = array<i64: 2, 2>} : (tensor<2x4x9x9xf32>, tensor<8x2x3x3xf32>, tensor<8xf32>) -> tensor<2x8x5x5xf32>
  %0 = dlopt.conv2d %x, %w bias(%b) {stride = array<i64: 2, 2>, padding = array<i64: 1, 1>, groups = 2} : (tensor<2x4x9x9xf32>, tensor<8x2x3x3xf32>, tensor<8xf32>) -> tensor<2x8x5x5xf32>
  // CHECK: dlopt.conv2d %{{.*}}, %{{.*}} {dilation = array<i64: 2, 2>} : (tensor<2x4x9x9xf32>, tensor<8x4x3x3xf32>) -> tensor<2x8x5x5xf32>
  %w2 = dlopt.reshape %w : tensor<8x2x3x3xf32> -> tensor<4x4x3x3xf32>
  %w3 = dlopt.concat %w2, %w2 dim = 0 : tensor<4x4x3x3xf32>, tensor<4x4x3x3xf32> -> tensor<8x4x3x3xf32>
  %1 = dlopt.conv2d %x, %w3 {dilation = array<i64: 2, 2>} : (tensor<2x4x9x9xf32>, tensor<8x4x3x3xf32>) -> tensor<2x8x5x5xf32>
  // CHECK: dlopt.max_pool2d %{{.*}} {kernel = array<i64: 3, 3>, padding = array<i64: 1, 1>, stride = array<i64: 2, 2>} : tensor<2x8x5x5xf32> -> tensor<2x8x3x3xf32>
  %2 = dlopt.max_pool2d %1 {kernel = array<i64: 3, 3>, stride = array<i64: 2, 2>, padding = array<i64: 1, 1>} : tensor<2x8x5x5xf32> -> tensor<2x8x3x3xf32>
  // CHECK: dlopt.avg_pool2d %{{.*}} {count_include_pad = false, kernel = array<i64: 3, 3>} : tensor<2x8x3x3xf32> -> tensor<2x8x1x1xf32>
  %3 = dlopt.avg_pool2d %2 {kernel = array<i64: 3, 3>, count_include_pad = false} : tensor<2x8x3x3xf32> -> tensor<2x8x1x1xf32>
  // CHECK: dlopt.batch_norm %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {training} : (tensor<2x8x5x5xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<2x8x5x5xf32>, tensor<8xf32>, tensor<8xf32>)
  %4:3 = dlopt.batch_norm %0, %b, %b, %s, %s {training} : (tensor<2x8x5x5xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<2x8x5x5xf32>, tensor<8xf32>, tensor<8xf32>)
  return %4#0, %4#1 : tensor<2x8x5x5xf32>, tensor<8xf32>
}

// CHECK-LABEL: func @losses
func.func @losses(%l: tensor<8x10xf32>, %y: tensor<8xi32>, %a: tensor<3x4xbf16>) -> (tensor<f32>, tensor<bf16>) {
  // CHECK: dlopt.cross_entropy %{{.*}}, %{{.*}} {ignore_index = 0 : i64} : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
  %0 = dlopt.cross_entropy %l, %y {ignore_index = 0} : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
  // CHECK: dlopt.mse %{{.*}}, %{{.*}} : tensor<3x4xbf16>, tensor<3x4xbf16> -> tensor<bf16>
  %1 = dlopt.mse %a, %a : tensor<3x4xbf16>, tensor<3x4xbf16> -> tensor<bf16>
  return %0, %1 : tensor<f32>, tensor<bf16>
}

// bf16 logits: the loss in their type or in f32; the gradient's dloss in
// either, its result in the logits' type.
// CHECK-LABEL: func @mixed_losses
func.func @mixed_losses(%l: tensor<8x10xbf16>, %y: tensor<8xi32>, %d: tensor<f32>, %e: tensor<bf16>) -> (tensor<f32>, tensor<bf16>, tensor<8x10xbf16>, tensor<8x10xbf16>) {
  // CHECK: dlopt.cross_entropy %{{.*}}, %{{.*}} : tensor<8x10xbf16>, tensor<8xi32> -> tensor<f32>
  %0 = dlopt.cross_entropy %l, %y : tensor<8x10xbf16>, tensor<8xi32> -> tensor<f32>
  // CHECK: dlopt.cross_entropy %{{.*}}, %{{.*}} : tensor<8x10xbf16>, tensor<8xi32> -> tensor<bf16>
  %1 = dlopt.cross_entropy %l, %y : tensor<8x10xbf16>, tensor<8xi32> -> tensor<bf16>
  // CHECK: dlopt.cross_entropy_grad {{.*}} : (tensor<8x10xbf16>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xbf16>
  %2 = dlopt.cross_entropy_grad %l, %y, %d : (tensor<8x10xbf16>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xbf16>
  // CHECK: dlopt.cross_entropy_grad {{.*}} : (tensor<8x10xbf16>, tensor<8xi32>, tensor<bf16>) -> tensor<8x10xbf16>
  %3 = dlopt.cross_entropy_grad %l, %y, %e : (tensor<8x10xbf16>, tensor<8xi32>, tensor<bf16>) -> tensor<8x10xbf16>
  return %0, %1, %2, %3 : tensor<f32>, tensor<bf16>, tensor<8x10xbf16>, tensor<8x10xbf16>
}

// CHECK-LABEL: func @model
// CHECK-SAME: {dlopt.input = "x"}
// CHECK-SAME: dlopt.init = {dist = "uniform", high = 1.000000e-01 : f64, low = -1.000000e-01 : f64}, dlopt.param = "w"
// CHECK-SAME: {dlopt.output = "loss"}
// CHECK-SAME: attributes {dlopt.loss}
func.func @model(%x: tensor<4x4xf32> {dlopt.input = "x"},
                 %w: tensor<4x4xf32> {dlopt.param = "w", dlopt.init = {dist = "uniform", low = -0.1, high = 0.1}})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  // CHECK: dlopt.matmul {{.*}} {dlopt.layer = 3 : i64}
  %0 = dlopt.matmul %x, %w {dlopt.layer = 3} : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %1 = dlopt.mse %0, %x : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<f32>
  return %1 : tensor<f32>
}
