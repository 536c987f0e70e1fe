// RUN: dlopt-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(dlopt-fold-batch-reductions))' | FileCheck %s

// A weight gradient summed over the batch becomes one GEMM over the
// flattened rows; the new ops keep the sum's marks, and only the GEMM keeps
// its stable id.
// CHECK-LABEL: func @weight_grad
// CHECK-SAME: (%[[X:.+]]: tensor<4x16x64xf32>, %[[DY:.+]]: tensor<4x16x256xf32>)
// CHECK: %[[A:.+]] = dlopt.reshape %[[X]] {dlopt.backward, dlopt.fwd_id = 7 : i64, dlopt.layer = 1 : i64} : tensor<4x16x64xf32> -> tensor<64x64xf32>
// CHECK: %[[B:.+]] = dlopt.reshape %[[DY]] {dlopt.backward, dlopt.fwd_id = 7 : i64, dlopt.layer = 1 : i64} : tensor<4x16x256xf32> -> tensor<64x256xf32>
// CHECK: %[[W:.+]] = dlopt.matmul %[[A]], %[[B]] {dlopt.backward, dlopt.fwd_id = 7 : i64, dlopt.layer = 1 : i64, transpose_a} : tensor<64x64xf32>, tensor<64x256xf32> -> tensor<64x256xf32>
// CHECK-NOT: dlopt.sum
// CHECK: return %[[W]]
func.func @weight_grad(%x: tensor<4x16x64xf32>, %dy: tensor<4x16x256xf32>) -> tensor<64x256xf32> {
  %g = dlopt.matmul %x, %dy {dlopt.backward, dlopt.fwd_id = 7 : i64, dlopt.layer = 1 : i64, transpose_a} : tensor<4x16x64xf32>, tensor<4x16x256xf32> -> tensor<4x64x256xf32>
  %w = dlopt.sum %g dims = [0] {dlopt.backward, dlopt.fwd_id = 7 : i64, dlopt.layer = 1 : i64} : tensor<4x64x256xf32> -> tensor<64x256xf32>
  return %w : tensor<64x256xf32>
}

// -----

// Two batch dims (and negative dims), bf16.
// CHECK-LABEL: func @two_batch_dims
// CHECK: dlopt.reshape %{{.+}} {dlopt.fwd_id = 3 : i64} : tensor<2x3x8x5xbf16> -> tensor<48x5xbf16>
// CHECK: dlopt.reshape %{{.+}} {dlopt.fwd_id = 3 : i64} : tensor<2x3x8x7xbf16> -> tensor<48x7xbf16>
// CHECK: dlopt.matmul %{{.+}}, %{{.+}} {dlopt.id = 3 : i64, transpose_a} : tensor<48x5xbf16>, tensor<48x7xbf16> -> tensor<5x7xbf16>
// CHECK-NOT: dlopt.sum
func.func @two_batch_dims(%x: tensor<2x3x8x5xbf16>, %dy: tensor<2x3x8x7xbf16>) -> tensor<5x7xbf16> {
  %g = dlopt.matmul %x, %dy {transpose_a} : tensor<2x3x8x5xbf16>, tensor<2x3x8x7xbf16> -> tensor<2x3x5x7xbf16>
  %w = dlopt.sum %g dims = [-4, 1] {dlopt.id = 3 : i64} : tensor<2x3x5x7xbf16> -> tensor<5x7xbf16>
  return %w : tensor<5x7xbf16>
}

// -----

// Left alone: a broadcast operand, a product with another use, a sum over
// only some batch dims, keepdims, and no transpose_a.
// CHECK-LABEL: func @left_alone
// CHECK-COUNT-5: dlopt.sum
func.func @left_alone(%x: tensor<4x16x64xf32>, %w: tensor<16x8xf32>, %dy: tensor<4x16x8xf32>,
                      %y: tensor<2x3x8x5xf32>, %e: tensor<2x3x8x7xf32>, %xt: tensor<4x64x16xf32>)
    -> (tensor<64x8xf32>, tensor<64x8xf32>, tensor<4x64x8xf32>, tensor<3x5x7xf32>, tensor<1x64x8xf32>, tensor<64x8xf32>) {
  %b = dlopt.matmul %x, %w {transpose_a} : tensor<4x16x64xf32>, tensor<16x8xf32> -> tensor<4x64x8xf32>
  %s0 = dlopt.sum %b dims = [0] : tensor<4x64x8xf32> -> tensor<64x8xf32>
  %g = dlopt.matmul %x, %dy {transpose_a} : tensor<4x16x64xf32>, tensor<4x16x8xf32> -> tensor<4x64x8xf32>
  %s1 = dlopt.sum %g dims = [0] : tensor<4x64x8xf32> -> tensor<64x8xf32>
  %h = dlopt.matmul %y, %e {transpose_a} : tensor<2x3x8x5xf32>, tensor<2x3x8x7xf32> -> tensor<2x3x5x7xf32>
  %s2 = dlopt.sum %h dims = [0] : tensor<2x3x5x7xf32> -> tensor<3x5x7xf32>
  %k = dlopt.matmul %x, %dy {transpose_a} : tensor<4x16x64xf32>, tensor<4x16x8xf32> -> tensor<4x64x8xf32>
  %s3 = dlopt.sum %k dims = [0] keepdims : tensor<4x64x8xf32> -> tensor<1x64x8xf32>
  %n = dlopt.matmul %xt, %dy : tensor<4x64x16xf32>, tensor<4x16x8xf32> -> tensor<4x64x8xf32>
  %s4 = dlopt.sum %n dims = [0] : tensor<4x64x8xf32> -> tensor<64x8xf32>
  return %s0, %s1, %g, %s2, %s3, %s4 : tensor<64x8xf32>, tensor<64x8xf32>, tensor<4x64x8xf32>, tensor<3x5x7xf32>, tensor<1x64x8xf32>, tensor<64x8xf32>
}

// -----

// Reductions over size-1 dims are reshapes (sum, mean, max), or nothing
// with keepdims.
// CHECK-LABEL: func @unit
// CHECK-SAME: (%[[X:.+]]: tensor<1x64x8xf32>)
// CHECK: %[[A:.+]] = dlopt.reshape %[[X]] {dlopt.backward} : tensor<1x64x8xf32> -> tensor<64x8xf32>
// CHECK: %[[C:.+]] = dlopt.reshape %[[X]] : tensor<1x64x8xf32> -> tensor<64x8xf32>
// CHECK: %[[D:.+]] = dlopt.sum %[[X]] dims = [0, 1]
// CHECK-NOT: dlopt.mean
// CHECK-NOT: dlopt.max
// CHECK: return %[[A]], %[[X]], %[[C]], %[[D]]
func.func @unit(%x: tensor<1x64x8xf32>) -> (tensor<64x8xf32>, tensor<1x64x8xf32>, tensor<64x8xf32>, tensor<8xf32>) {
  %a = dlopt.sum %x dims = [0] {dlopt.backward} : tensor<1x64x8xf32> -> tensor<64x8xf32>
  %b = dlopt.mean %x dims = [0] keepdims : tensor<1x64x8xf32> -> tensor<1x64x8xf32>
  %c = dlopt.max %x dims = [-3] : tensor<1x64x8xf32> -> tensor<64x8xf32>
  %d = dlopt.sum %x dims = [0, 1] : tensor<1x64x8xf32> -> tensor<8xf32>
  return %a, %b, %c, %d : tensor<64x8xf32>, tensor<1x64x8xf32>, tensor<64x8xf32>, tensor<8xf32>
}
