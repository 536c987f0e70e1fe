// The global gradient norm (result grad_norm) costs a pass over every
// gradient. grad-norm=false leaves it out when nothing needs it; clipping
// needs it, so the two are refused together.
// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=adamw" | FileCheck %s --check-prefix=NORM
// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=adamw grad-norm=false" | FileCheck %s --check-prefix=NONE
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=sgd clip-norm=1.0 grad-norm=false" 2>&1 | FileCheck %s --check-prefix=CLIP

// NORM-LABEL: func @main
// NORM-SAME: -> (tensor<f32> {dlopt.output = "loss"}, tensor<f32> {dlopt.output = "lr"}, tensor<f32> {dlopt.output = "grad_norm"},
// NORM: dlopt.abs
// NORM: dlopt.sqrt

// NONE-LABEL: func @main
// NONE-SAME: -> (tensor<f32> {dlopt.output = "loss"}, tensor<f32> {dlopt.output = "lr"}, tensor<4x3xf32> {dlopt.output = "w", dlopt.update = "w"},
// NONE-NOT: grad_norm
// NONE-NOT: dlopt.abs
// NONE: return

// CLIP: error: dlopt-optimizer: clip-norm 1.000000e+00 needs the gradient norm (grad-norm=false)
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"},
                %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %l = dlopt.mse %h, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}
