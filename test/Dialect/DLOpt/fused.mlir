// RUN: dlopt-opt %s | dlopt-opt | FileCheck %s
// RUN: dlopt-opt %s --mlir-print-op-generic | dlopt-opt | FileCheck %s

// CHECK-LABEL: func @fused
// CHECK: %[[R:.+]]:2 = dlopt.fused_elementwise(%{{.+}}, %{{.+}}, %{{.+}}) attributes {dlopt.layer = 2 : i64} : (tensor<4x8xf32>, tensor<4x8xbf16>, tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xbf16>) {
// CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<4x8xf32>, %[[B:.+]]: tensor<4x8xbf16>, %[[S:.+]]: tensor<f32>):
// CHECK-NEXT: %[[C:.+]] = arith.constant dense<0.899999976> : tensor<f32>
// CHECK-NEXT: %[[X:.+]] = dlopt.mul %[[A]], %[[C]]
// CHECK-NEXT: %[[BF:.+]] = dlopt.cast %[[B]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK-NEXT: %[[Y:.+]] = dlopt.add %[[X]], %[[BF]]
// CHECK-NEXT: %[[Z:.+]] = dlopt.pow %[[Y]], %[[S]]
// CHECK-NEXT: %[[H:.+]] = dlopt.cast %[[Z]] : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK-NEXT: dlopt.yield %[[Y]], %[[H]] : tensor<4x8xf32>, tensor<4x8xbf16>
// CHECK: return %[[R]]#0, %[[R]]#1
func.func @fused(%m: tensor<4x8xf32>, %g: tensor<4x8xbf16>, %p: tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xbf16>) {
  %r:2 = dlopt.fused_elementwise(%m, %g, %p) attributes {dlopt.layer = 2} : (tensor<4x8xf32>, tensor<4x8xbf16>, tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xbf16>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<4x8xbf16>, %s: tensor<f32>):
    %c = arith.constant dense<0.9> : tensor<f32>
    %0 = dlopt.mul %a, %c : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
    %1 = dlopt.cast %b : tensor<4x8xbf16> -> tensor<4x8xf32>
    %2 = dlopt.add %0, %1 : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
    %3 = dlopt.pow %2, %s : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
    %4 = dlopt.cast %3 : tensor<4x8xf32> -> tensor<4x8xbf16>
    dlopt.yield %2, %4 : tensor<4x8xf32>, tensor<4x8xbf16>
  }
  return %r#0, %r#1 : tensor<4x8xf32>, tensor<4x8xbf16>
}

// CHECK-LABEL: func @fused_segments
// CHECK: %[[R:.+]]:2 = dlopt.fused_elementwise(%{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}) attributes {segments = 2 : i64} : (tensor<8xf32>, tensor<f32>, tensor<3x5xf32>, tensor<f32>) -> (tensor<8xf32>, tensor<3x5xf32>) {
// CHECK-NEXT: ^bb0(%[[X:.+]]: tensor<8xf32>, %[[K:.+]]: tensor<f32>):
// CHECK-NEXT: dlopt.mul %[[X]], %[[K]]
func.func @fused_segments(%a: tensor<8xf32>, %b: tensor<3x5xf32>, %s: tensor<f32>) -> (tensor<8xf32>, tensor<3x5xf32>) {
  %r:2 = dlopt.fused_elementwise(%a, %s, %b, %s) attributes {segments = 2 : i64} : (tensor<8xf32>, tensor<f32>, tensor<3x5xf32>, tensor<f32>) -> (tensor<8xf32>, tensor<3x5xf32>) {
  ^bb0(%x: tensor<8xf32>, %k: tensor<f32>):
    %0 = dlopt.mul %x, %k : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
    dlopt.yield %0 : tensor<8xf32>
  }
  return %r#0, %r#1 : tensor<8xf32>, tensor<3x5xf32>
}
