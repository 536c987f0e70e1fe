// RUN: dlopt-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(dlopt-fold-loss-casts))' | FileCheck %s

// The mixed-precision loss: both ops read the bf16 logits, the loss stays
// f32, the gradient comes out bf16, and the f32 copies are gone. Marks and
// stable ids stay on the ops.
// CHECK-LABEL: func @bf16_loss
// CHECK-SAME: (%[[X:.+]]: tensor<8x10xbf16>, %[[Y:.+]]: tensor<8xi32>, %[[D:.+]]: tensor<f32>)
// CHECK-NOT: dlopt.cast
// CHECK: %[[L:.+]] = dlopt.cross_entropy %[[X]], %[[Y]] {dlopt.id = 5 : i64, ignore_index = 3 : i64} : tensor<8x10xbf16>, tensor<8xi32> -> tensor<f32>
// CHECK: %[[G:.+]] = dlopt.cross_entropy_grad %[[X]], %[[Y]], %[[D]] {dlopt.backward, dlopt.fwd_id = 5 : i64, ignore_index = 3 : i64} : (tensor<8x10xbf16>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xbf16>
// CHECK-NOT: dlopt.cast
// CHECK: return %[[L]], %[[G]]
func.func @bf16_loss(%x: tensor<8x10xbf16>, %y: tensor<8xi32>, %d: tensor<f32>) -> (tensor<f32>, tensor<8x10xbf16>) {
  %f = dlopt.cast %x : tensor<8x10xbf16> -> tensor<8x10xf32>
  %l = dlopt.cross_entropy %f, %y {dlopt.id = 5 : i64, ignore_index = 3 : i64} : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
  %g = dlopt.cross_entropy_grad %f, %y, %d {dlopt.backward, dlopt.fwd_id = 5 : i64, ignore_index = 3 : i64} : (tensor<8x10xf32>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xf32>
  %h = dlopt.cast %g : tensor<8x10xf32> -> tensor<8x10xbf16>
  return %l, %h : tensor<f32>, tensor<8x10xbf16>
}

// -----

// f16 logits the same way.
// CHECK-LABEL: func @f16_loss
// CHECK: dlopt.cross_entropy %{{.+}}, %{{.+}} : tensor<4x6xf16>, tensor<4xi64> -> tensor<f32>
// CHECK: dlopt.cross_entropy_grad %{{.+}} : (tensor<4x6xf16>, tensor<4xi64>, tensor<f32>) -> tensor<4x6xf16>
// CHECK-NOT: dlopt.cast
func.func @f16_loss(%x: tensor<4x6xf16>, %y: tensor<4xi64>, %d: tensor<f32>) -> (tensor<f32>, tensor<4x6xf16>) {
  %f = dlopt.cast %x : tensor<4x6xf16> -> tensor<4x6xf32>
  %l = dlopt.cross_entropy %f, %y : tensor<4x6xf32>, tensor<4xi64> -> tensor<f32>
  %g = dlopt.cross_entropy_grad %f, %y, %d : (tensor<4x6xf32>, tensor<4xi64>, tensor<f32>) -> tensor<4x6xf32>
  %h = dlopt.cast %g : tensor<4x6xf32> -> tensor<4x6xf16>
  return %l, %h : tensor<f32>, tensor<4x6xf16>
}

// -----

// The f32 gradient has another use: it stays f32 (and so does the widened
// copy it reads); the loss still reads the bf16 logits.
// CHECK-LABEL: func @grad_used_twice
// CHECK: %[[F:.+]] = dlopt.cast %{{.+}} : tensor<8x10xbf16> -> tensor<8x10xf32>
// CHECK: dlopt.cross_entropy %{{.+}}, %{{.+}} : tensor<8x10xbf16>, tensor<8xi32> -> tensor<f32>
// CHECK: %[[G:.+]] = dlopt.cross_entropy_grad %[[F]], {{.+}} -> tensor<8x10xf32>
// CHECK: dlopt.cast %[[G]] : tensor<8x10xf32> -> tensor<8x10xbf16>
func.func @grad_used_twice(%x: tensor<8x10xbf16>, %y: tensor<8xi32>, %d: tensor<f32>) -> (tensor<f32>, tensor<8x10xbf16>, tensor<8x10xf32>) {
  %f = dlopt.cast %x : tensor<8x10xbf16> -> tensor<8x10xf32>
  %l = dlopt.cross_entropy %f, %y : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
  %g = dlopt.cross_entropy_grad %f, %y, %d : (tensor<8x10xf32>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xf32>
  %h = dlopt.cast %g : tensor<8x10xf32> -> tensor<8x10xbf16>
  return %l, %h, %g : tensor<f32>, tensor<8x10xbf16>, tensor<8x10xf32>
}

// -----

// Nothing to do: f32 logits, a gradient cast to another type than the
// logits', and logits that are not a widening (an f32 -> f32 chain).
// CHECK-LABEL: func @untouched
// CHECK: dlopt.cross_entropy %{{.+}}, %{{.+}} : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
// CHECK: %[[F:.+]] = dlopt.cast %{{.+}} : tensor<8x10xbf16> -> tensor<8x10xf32>
// CHECK: %[[G:.+]] = dlopt.cross_entropy_grad %[[F]], {{.+}} -> tensor<8x10xf32>
// CHECK: dlopt.cast %[[G]] : tensor<8x10xf32> -> tensor<8x10xf16>
func.func @untouched(%a: tensor<8x10xf32>, %x: tensor<8x10xbf16>, %y: tensor<8xi32>, %d: tensor<f32>) -> (tensor<f32>, tensor<8x10xf16>) {
  %l = dlopt.cross_entropy %a, %y : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
  %f = dlopt.cast %x : tensor<8x10xbf16> -> tensor<8x10xf32>
  %g = dlopt.cross_entropy_grad %f, %y, %d : (tensor<8x10xf32>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xf32>
  %h = dlopt.cast %g : tensor<8x10xf32> -> tensor<8x10xf16>
  return %l, %h : tensor<f32>, tensor<8x10xf16>
}
