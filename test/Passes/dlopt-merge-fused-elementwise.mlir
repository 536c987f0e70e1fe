// RUN: dlopt-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(dlopt-merge-fused-elementwise))" | FileCheck %s

// Three independent groups with one program over different shapes (and a
// shared scalar): one multi-tensor group at the last of them, segment-major
// inputs and results, the first group's body.
// CHECK-LABEL: func @three_params
// CHECK-SAME: (%[[A:.+]]: tensor<8xf32>, %[[B:.+]]: tensor<3x5xf32>, %[[C:.+]]: tensor<2x2x2xf32>, %[[LR:.+]]: tensor<f32>)
// CHECK-NEXT: %[[R:.+]]:3 = dlopt.fused_elementwise(%[[A]], %[[LR]], %[[B]], %[[LR]], %[[C]], %[[LR]]) attributes {segments = 3 : i64} : (tensor<8xf32>, tensor<f32>, tensor<3x5xf32>, tensor<f32>, tensor<2x2x2xf32>, tensor<f32>) -> (tensor<8xf32>, tensor<3x5xf32>, tensor<2x2x2xf32>) {
// CHECK-NEXT: ^bb0(%[[X:.+]]: tensor<8xf32>, %[[S:.+]]: tensor<f32>):
// CHECK-NEXT: %[[K:.+]] = arith.constant dense<0.899999976> : tensor<f32>
// CHECK-NEXT: %[[M:.+]] = dlopt.mul %[[X]], %[[K]]
// CHECK-NEXT: %[[N:.+]] = dlopt.sub %[[X]], %[[M]]
// CHECK-NEXT: dlopt.yield %[[N]] : tensor<8xf32>
// CHECK-NEXT: }
// CHECK-NEXT: return %[[R]]#0, %[[R]]#1, %[[R]]#2
// CHECK-NOT: dlopt.fused_elementwise
func.func @three_params(%a: tensor<8xf32>, %b: tensor<3x5xf32>, %c: tensor<2x2x2xf32>, %lr: tensor<f32>) -> (tensor<8xf32>, tensor<3x5xf32>, tensor<2x2x2xf32>) {
  %0 = dlopt.fused_elementwise(%a, %lr) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32> {
  ^bb0(%x: tensor<8xf32>, %s: tensor<f32>):
    %k = arith.constant dense<0.9> : tensor<f32>
    %m = dlopt.mul %x, %k : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
    %n = dlopt.sub %x, %m : tensor<8xf32>, tensor<8xf32> -> tensor<8xf32>
    dlopt.yield %n : tensor<8xf32>
  }
  %1 = dlopt.fused_elementwise(%b, %lr) : (tensor<3x5xf32>, tensor<f32>) -> tensor<3x5xf32> {
  ^bb0(%x: tensor<3x5xf32>, %s: tensor<f32>):
    %k = arith.constant dense<0.9> : tensor<f32>
    %m = dlopt.mul %x, %k : tensor<3x5xf32>, tensor<f32> -> tensor<3x5xf32>
    %n = dlopt.sub %x, %m : tensor<3x5xf32>, tensor<3x5xf32> -> tensor<3x5xf32>
    dlopt.yield %n : tensor<3x5xf32>
  }
  %2 = dlopt.fused_elementwise(%c, %lr) : (tensor<2x2x2xf32>, tensor<f32>) -> tensor<2x2x2xf32> {
  ^bb0(%x: tensor<2x2x2xf32>, %s: tensor<f32>):
    %k = arith.constant dense<0.9> : tensor<f32>
    %m = dlopt.mul %x, %k : tensor<2x2x2xf32>, tensor<f32> -> tensor<2x2x2xf32>
    %n = dlopt.sub %x, %m : tensor<2x2x2xf32>, tensor<2x2x2xf32> -> tensor<2x2x2xf32>
    dlopt.yield %n : tensor<2x2x2xf32>
  }
  return %0, %1, %2 : tensor<8xf32>, tensor<3x5xf32>, tensor<2x2x2xf32>
}

// -----

// Programs that differ (a constant, an opcode, an element type) are not
// merged; the two equal ones are, at the later one's place.
// CHECK-LABEL: func @different_programs
// CHECK: dlopt.fused_elementwise(%{{.+}}) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK: arith.constant dense<5.000000e-01>
// CHECK: dlopt.fused_elementwise(%{{.+}}) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK: dlopt.exp
// CHECK: dlopt.fused_elementwise(%{{.+}}) : (tensor<4xbf16>) -> tensor<4xbf16>
// CHECK: dlopt.fused_elementwise(%{{.+}}, %{{.+}}) attributes {segments = 2 : i64} : (tensor<4xf32>, tensor<6xf32>) -> (tensor<4xf32>, tensor<6xf32>)
// CHECK-NOT: dlopt.fused_elementwise
func.func @different_programs(%a: tensor<4xf32>, %b: tensor<6xf32>, %h: tensor<4xbf16>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<6xf32>, tensor<4xbf16>) {
  %0 = dlopt.fused_elementwise(%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    %k = arith.constant dense<0.25> : tensor<f32>
    %m = dlopt.mul %x, %k : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
    %n = dlopt.sqrt %m : tensor<4xf32>
    dlopt.yield %n : tensor<4xf32>
  }
  %1 = dlopt.fused_elementwise(%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    %k = arith.constant dense<0.5> : tensor<f32>
    %m = dlopt.mul %x, %k : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
    %n = dlopt.sqrt %m : tensor<4xf32>
    dlopt.yield %n : tensor<4xf32>
  }
  %2 = dlopt.fused_elementwise(%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    %k = arith.constant dense<0.25> : tensor<f32>
    %m = dlopt.mul %x, %k : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
    %n = dlopt.exp %m : tensor<4xf32>
    dlopt.yield %n : tensor<4xf32>
  }
  %3 = dlopt.fused_elementwise(%h) : (tensor<4xbf16>) -> tensor<4xbf16> {
  ^bb0(%x: tensor<4xbf16>):
    %k = arith.constant dense<0.25> : tensor<bf16>
    %m = dlopt.mul %x, %k : tensor<4xbf16>, tensor<bf16> -> tensor<4xbf16>
    %n = dlopt.sqrt %m : tensor<4xbf16>
    dlopt.yield %n : tensor<4xbf16>
  }
  %4 = dlopt.fused_elementwise(%b) : (tensor<6xf32>) -> tensor<6xf32> {
  ^bb0(%x: tensor<6xf32>):
    %k = arith.constant dense<0.25> : tensor<f32>
    %m = dlopt.mul %x, %k : tensor<6xf32>, tensor<f32> -> tensor<6xf32>
    %n = dlopt.sqrt %m : tensor<6xf32>
    dlopt.yield %n : tensor<6xf32>
  }
  return %0, %1, %2, %4, %3 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<6xf32>, tensor<4xbf16>
}

// -----

// The second group reads the first one's result (a dependence): not merged
// with it. The third one cannot join the first either (the second group,
// a reader of the first's result, sits before it); it merges with the
// second instead.
// CHECK-LABEL: func @dependence
// CHECK-SAME: (%[[A:.+]]: tensor<4xf32>, %[[B:.+]]: tensor<5xf32>)
// CHECK-NEXT: %[[R0:.+]] = dlopt.fused_elementwise(%[[A]]) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK: %[[R:.+]]:2 = dlopt.fused_elementwise(%[[R0]], %[[B]]) attributes {segments = 2 : i64} : (tensor<4xf32>, tensor<5xf32>) -> (tensor<4xf32>, tensor<5xf32>)
// CHECK: return %[[R0]], %[[R]]#0, %[[R]]#1
func.func @dependence(%a: tensor<4xf32>, %b: tensor<5xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<5xf32>) {
  %0 = dlopt.fused_elementwise(%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    %m = dlopt.exp %x : tensor<4xf32>
    %n = dlopt.neg %m : tensor<4xf32>
    dlopt.yield %n : tensor<4xf32>
  }
  %1 = dlopt.fused_elementwise(%0) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    %m = dlopt.exp %x : tensor<4xf32>
    %n = dlopt.neg %m : tensor<4xf32>
    dlopt.yield %n : tensor<4xf32>
  }
  %2 = dlopt.fused_elementwise(%b) : (tensor<5xf32>) -> tensor<5xf32> {
  ^bb0(%x: tensor<5xf32>):
    %m = dlopt.exp %x : tensor<5xf32>
    %n = dlopt.neg %m : tensor<5xf32>
    dlopt.yield %n : tensor<5xf32>
  }
  return %0, %1, %2 : tensor<4xf32>, tensor<4xf32>, tensor<5xf32>
}

// -----

// A use of the first group's result between the groups (not a dependence of
// the second group, but the merged op would not dominate it): not merged.
// Different marks: not merged either.
// CHECK-LABEL: func @use_between
// CHECK: dlopt.fused_elementwise(%{{.+}}) : (tensor<4xf32>)
// CHECK-NEXT: ^bb0
// CHECK: dlopt.add
// CHECK: dlopt.fused_elementwise(%{{.+}}) : (tensor<5xf32>)
// CHECK: dlopt.fused_elementwise(%{{.+}}) attributes {dlopt.layer = 1 : i64} : (tensor<6xf32>)
// CHECK-NOT: segments
func.func @use_between(%a: tensor<4xf32>, %b: tensor<5xf32>, %c: tensor<6xf32>) -> (tensor<4xf32>, tensor<5xf32>, tensor<6xf32>) {
  %0 = dlopt.fused_elementwise(%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    %m = dlopt.exp %x : tensor<4xf32>
    %n = dlopt.neg %m : tensor<4xf32>
    dlopt.yield %n : tensor<4xf32>
  }
  %u = dlopt.add %0, %a : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %1 = dlopt.fused_elementwise(%b) : (tensor<5xf32>) -> tensor<5xf32> {
  ^bb0(%x: tensor<5xf32>):
    %m = dlopt.exp %x : tensor<5xf32>
    %n = dlopt.neg %m : tensor<5xf32>
    dlopt.yield %n : tensor<5xf32>
  }
  %2 = dlopt.fused_elementwise(%c) attributes {dlopt.layer = 1 : i64} : (tensor<6xf32>) -> tensor<6xf32> {
  ^bb0(%x: tensor<6xf32>):
    %m = dlopt.exp %x : tensor<6xf32>
    %n = dlopt.neg %m : tensor<6xf32>
    dlopt.yield %n : tensor<6xf32>
  }
  return %u, %1, %2 : tensor<4xf32>, tensor<5xf32>, tensor<6xf32>
}
