// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --verify-diagnostics | FileCheck %s

// Broadcasting: the bias gradient is reduced back to the bias shape; the
// backward ops carry the layer mark of the op they differentiate.
// CHECK-LABEL: func @main
// CHECK-SAME: -> (tensor<f32> {dlopt.output = "loss"}, tensor<4x3xf32> {dlopt.grad = "w", dlopt.output = "grad.w"}, tensor<3xf32> {dlopt.grad = "b", dlopt.output = "grad.b"})
// CHECK: %[[H:.+]] = dlopt.matmul %[[X:.+]], %[[W:.+]] {dlopt.layer = 0 : i64}
// CHECK: %[[Y:.+]] = dlopt.add %[[H]], %[[B:.+]] {dlopt.layer = 0 : i64}
// CHECK: %[[L:.+]] = dlopt.mse
// CHECK: %[[ONE:.+]] = arith.constant dense<1.000000e+00> : tensor<f32>
// CHECK: dlopt.sub
// CHECK: %[[DB:.+]] = dlopt.sum %[[DY:.+]] dims = [0] {dlopt.backward, dlopt.layer = 0 : i64} : tensor<8x3xf32> -> tensor<3xf32>
// CHECK: %[[DW:.+]] = dlopt.matmul %[[X]], %[[DY]] {dlopt.backward, dlopt.layer = 0 : i64, transpose_a}
// CHECK: return %[[L]], %[[DW]], %[[DB]]
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"},
                %b: tensor<3xf32> {dlopt.param = "b"},
                %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w {dlopt.layer = 0} : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %y = dlopt.add %h, %b {dlopt.layer = 0} : tensor<8x3xf32>, tensor<3xf32> -> tensor<8x3xf32>
  %l = dlopt.mse %y, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A value used twice accumulates both gradients.
// CHECK-LABEL: func @main
// CHECK: %[[E:.+]] = dlopt.exp %[[W:.+]] :
// CHECK: %[[M:.+]] = dlopt.mul %[[E]], %[[E]]
// CHECK: %[[G1:.+]] = dlopt.mul %{{.+}}, %[[E]]
// CHECK: %[[G2:.+]] = dlopt.mul %{{.+}}, %[[E]]
// CHECK: %[[ACC:.+]] = dlopt.add %[[G1]], %[[G2]]
// CHECK: dlopt.mul %[[ACC]], %[[E]]
func.func @main(%w: tensor<f32> {dlopt.param = "w"}) -> tensor<f32> attributes {dlopt.loss} {
  %e = dlopt.exp %w : tensor<f32>
  %m = dlopt.mul %e, %e : tensor<f32>, tensor<f32> -> tensor<f32>
  return %m : tensor<f32>
}

// -----

// Gather's gradient is a scatter-add; integer ids get none.
// CHECK-LABEL: func @main
// CHECK: dlopt.scatter_add %{{.+}}, %{{.+}} : tensor<2x3xi32>, tensor<2x3x4xf32> -> tensor<10x4xf32>
func.func @main(%ids: tensor<2x3xi32> {dlopt.input = "ids"},
                %t: tensor<10x4xf32> {dlopt.param = "table"}) -> tensor<f32> attributes {dlopt.loss} {
  %e = dlopt.gather %t, %ids : tensor<10x4xf32>, tensor<2x3xi32> -> tensor<2x3x4xf32>
  %s = dlopt.sum %e dims = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// A parameter that does not reach the loss: a warning and a zero gradient.
// CHECK-LABEL: func @main
// CHECK: %[[Z:.+]] = arith.constant dense<0.000000e+00> : tensor<3xf32>
// CHECK: return %{{.+}}, %{{.+}}, %[[Z]]
// expected-warning @+1 {{parameter 'unused' does not reach the loss through differentiable ops; its gradient is zero}}
func.func @main(%w: tensor<3xf32> {dlopt.param = "w"}, %u: tensor<3xf32> {dlopt.param = "unused"}) -> tensor<f32> attributes {dlopt.loss} {
  %s = dlopt.sum %w dims = [0] : tensor<3xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// expected-note @+1 {{while differentiating the loss of @main}}
func.func @main(%w: tensor<4xf32> {dlopt.param = "w"}, %d: tensor<4xf32> {dlopt.input = "d"}) -> tensor<f32> attributes {dlopt.loss} {
  // expected-error @+1 {{op 'dlopt.softmax_grad' is not differentiable, but the loss depends on its result}}
  %g = dlopt.softmax_grad %w, %d dim = 0 : tensor<4xf32>
  %s = dlopt.sum %g dims = [0] : tensor<4xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// expected-error @+1 {{expects a function marked dlopt.loss whose first result is a rank-0 float loss; nothing to differentiate}}
func.func @main(%w: tensor<4xf32> {dlopt.param = "w"}) -> tensor<4xf32> {
  return %w : tensor<4xf32>
}

// -----

// expected-error @+1 {{expects the loss (result #0) to be a rank-0 float tensor, got 'tensor<4xf32>'}}
func.func @main(%w: tensor<4xf32> {dlopt.param = "w"}) -> tensor<4xf32> attributes {dlopt.loss} {
  return %w : tensor<4xf32>
}

// -----

// ReLU's gradient reads the relu's result, not its input (y > 0 exactly
// where x > 0): the input need not outlive the forward pass.
// CHECK-LABEL: func @main
// CHECK: %[[Y:.+]] = dlopt.relu %[[X:.+]] :
// CHECK: %[[P:.+]] = dlopt.compare gt, %[[Y]], %{{.+}} : tensor<4xf32>, tensor<f32> -> tensor<4xi1>
// CHECK: dlopt.select %[[P]], %{{.+}}, %{{.+}} {dlopt.backward} : tensor<4xi1>, tensor<4xf32>, tensor<f32> -> tensor<4xf32>
// CHECK-NOT: dlopt.compare gt, %[[X]]
func.func @main(%w: tensor<4xf32> {dlopt.param = "w"}) -> tensor<f32> attributes {dlopt.loss} {
  %e = dlopt.exp %w : tensor<4xf32>
  %y = dlopt.relu %e : tensor<4xf32>
  %s = dlopt.sum %y dims = [0] : tensor<4xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// A parameter's narrow copy (mixed precision) used twice, as a tied
// embedding is: each gradient contribution is widened on its own and the
// sum is formed in f32, never rounded to bf16 as a sum.
// CHECK-LABEL: func @main
// CHECK: %[[WB:.+]] = dlopt.cast %[[W:.+]] : tensor<4x4xf32> -> tensor<4x4xbf16>
// CHECK: %[[G1:.+]] = dlopt.matmul {{.*}}transpose_a{{.*}} -> tensor<4x4xbf16>
// CHECK: %[[G2:.+]] = dlopt.matmul {{.*}} -> tensor<4x4xbf16>
// CHECK-DAG: %[[C1:.+]] = dlopt.cast %[[G2]] {dlopt.backward} : tensor<4x4xbf16> -> tensor<4x4xf32>
// CHECK-DAG: %[[C2:.+]] = dlopt.cast %[[G1]] {dlopt.backward} : tensor<4x4xbf16> -> tensor<4x4xf32>
// CHECK: %[[S:.+]] = dlopt.add %{{.+}}, %{{.+}} {dlopt.backward} : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
// CHECK-NOT: dlopt.add {{.*}}bf16
// CHECK: return %{{.+}}, %[[S]]
func.func @main(%x: tensor<2x4xbf16> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %wb = dlopt.cast %w : tensor<4x4xf32> -> tensor<4x4xbf16>
  %h = dlopt.matmul %x, %wb : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
  %y = dlopt.matmul %h, %wb : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
  %yf = dlopt.cast %y : tensor<2x4xbf16> -> tensor<2x4xf32>
  %l = dlopt.sum %yf dims = [0, 1] : tensor<2x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
