// RUN: dlopt-compile %s --emit=mlir -o - | FileCheck %s
// The compile pipeline checks the model, canonicalizes and CSEs.

// CHECK-LABEL: func.func @main
// CHECK: %[[E:.+]] = dlopt.exp
// CHECK-NEXT: %[[S:.+]] = dlopt.add %[[E]], %[[E]]
// CHECK-NEXT: return %[[S]]
func.func @main(%x: tensor<4xf32> {dlopt.input = "x"}) -> tensor<4xf32> {
  %0 = dlopt.exp %x : tensor<4xf32>
  %1 = dlopt.exp %x : tensor<4xf32>
  %2 = dlopt.reshape %1 : tensor<4xf32> -> tensor<4xf32>
  %3 = dlopt.add %0, %2 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %4 = dlopt.tanh %3 : tensor<4xf32>
  return %3 : tensor<4xf32>
}
