// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=lion" 2>&1 | FileCheck %s --check-prefix=NAME
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="schedule=cosine total-steps=5 warmup-steps=10" 2>&1 | FileCheck %s --check-prefix=STEPS
// RUN: not dlopt-opt %s --dlopt-optimizer 2>&1 | FileCheck %s --check-prefix=NOGRAD
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=sgd nesterov=true" 2>&1 | FileCheck %s --check-prefix=NESTEROV
// NAME: error: dlopt-optimizer: unknown optimizer 'lion', expected sgd, adam or adamw
// STEPS: error: dlopt-optimizer: schedule 'cosine' needs total-steps > warmup-steps, got total-steps = 5 and warmup-steps = 10
// NOGRAD: error: dlopt-optimizer: the function returns no dlopt.grad results; run dlopt-autodiff first
// NESTEROV: error: dlopt-optimizer: nesterov needs momentum > 0
func.func @main(%w: tensor<4xf32> {dlopt.param = "w"}) -> tensor<f32> attributes {dlopt.loss} {
  %s = dlopt.sum %w dims = [0] : tensor<4xf32> -> tensor<f32>
  return %s : tensor<f32>
}
