// RUN: dlopt-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(dlopt-fuse-elementwise))" | FileCheck %s
// RUN: dlopt-opt %s --split-input-file --pass-pipeline="builtin.module(func.func(dlopt-fuse-elementwise{min-group-size=3}))" | FileCheck %s --check-prefix=MIN3

// A chain with a rank-0 input and a constant: one group; the constant is
// copied into the body, the scalar stays an input, the value returned in the
// middle of the chain stays a result.
// CHECK-LABEL: func @chain
// CHECK-SAME: (%[[M:.+]]: tensor<4x8xf32>, %[[G:.+]]: tensor<4x8xf32>, %[[LR:.+]]: tensor<f32>)
// CHECK-NEXT: %[[R:.+]]:2 = dlopt.fused_elementwise(%[[M]], %[[G]], %[[LR]]) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
// CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<4x8xf32>, %[[B:.+]]: tensor<4x8xf32>, %[[S:.+]]: tensor<f32>):
// CHECK-NEXT: %[[C:.+]] = arith.constant dense<0.899999976> : tensor<f32>
// CHECK-NEXT: %[[X:.+]] = dlopt.mul %[[A]], %[[C]]
// CHECK-NEXT: %[[Y:.+]] = dlopt.add %[[X]], %[[B]]
// CHECK-NEXT: %[[Z:.+]] = dlopt.mul %[[Y]], %[[S]]
// CHECK-NEXT: %[[W:.+]] = dlopt.sqrt %[[Z]]
// CHECK-NEXT: dlopt.yield %[[Y]], %[[W]] : tensor<4x8xf32>, tensor<4x8xf32>
// CHECK-NEXT: }
// CHECK-NEXT: return %[[R]]#0, %[[R]]#1
// MIN3-LABEL: func @chain
// MIN3: dlopt.fused_elementwise
func.func @chain(%m: tensor<4x8xf32>, %g: tensor<4x8xf32>, %lr: tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %c = arith.constant dense<0.9> : tensor<f32>
  %0 = dlopt.mul %m, %c : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  %1 = dlopt.add %0, %g : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %2 = dlopt.mul %1, %lr : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  %3 = dlopt.sqrt %2 : tensor<4x8xf32>
  return %1, %3 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Two ops are the default minimum; min-group-size=3 leaves them alone.
// CHECK-LABEL: func @pair
// CHECK: dlopt.fused_elementwise
// MIN3-LABEL: func @pair
// MIN3-NOT: dlopt.fused_elementwise
// MIN3: dlopt.exp
// MIN3: dlopt.add
func.func @pair(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = dlopt.exp %x : tensor<4xf32>
  %1 = dlopt.add %0, %0 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// Different shapes never share a group; a broadcast other than from rank 0
// (bias [8] onto [4, 8]) is not fusible; integer ops are not fusible.
// CHECK-LABEL: func @shapes
// CHECK: %[[B:.+]] = dlopt.add %{{.+}}, %{{.+}} : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
// CHECK: %[[F:.+]] = dlopt.fused_elementwise(%[[B]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK: dlopt.exp
// CHECK: dlopt.tanh
// CHECK: dlopt.yield
// CHECK: dlopt.fused_elementwise(%{{.+}}) : (tensor<8xf32>) -> tensor<8xf32>
// CHECK: dlopt.neg
// CHECK: dlopt.relu
// CHECK: %[[I:.+]] = dlopt.add %{{.+}}, %{{.+}} : tensor<4xi32>
// CHECK-NEXT: dlopt.neg %[[I]] : tensor<4xi32>
func.func @shapes(%x: tensor<4x8xf32>, %b: tensor<8xf32>, %i: tensor<4xi32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<4xi32>) {
  %0 = dlopt.add %x, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
  %1 = dlopt.exp %0 : tensor<4x8xf32>
  %2 = dlopt.tanh %1 : tensor<4x8xf32>
  %3 = dlopt.neg %b : tensor<8xf32>
  %4 = dlopt.relu %3 : tensor<8xf32>
  %5 = dlopt.add %i, %i : tensor<4xi32>, tensor<4xi32> -> tensor<4xi32>
  %6 = dlopt.neg %5 : tensor<4xi32>
  return %2, %4, %6 : tensor<4x8xf32>, tensor<8xf32>, tensor<4xi32>
}

// -----

// An op outside the group reads %0 before the chain goes on: the group
// would be placed after that reader, so the chain is cut there.
// CHECK-LABEL: func @reader_between
// CHECK: %[[E:.+]] = dlopt.fused_elementwise(%{{.+}}) : (tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: %[[MM:.+]] = dlopt.matmul %[[E]], %[[E]]
// CHECK: dlopt.fused_elementwise(%[[E]], %[[MM]])
func.func @reader_between(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = dlopt.exp %x : tensor<4x4xf32>
  %1 = dlopt.sin %0 : tensor<4x4xf32>
  %2 = dlopt.matmul %1, %1 : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %3 = dlopt.add %1, %2 : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %4 = dlopt.cos %3 : tensor<4x4xf32>
  return %4 : tensor<4x4xf32>
}

// -----

// Ops join only with the same dlopt.* marks; the group keeps them. Casts
// between float types fuse (mixed precision chains).
// CHECK-LABEL: func @marks
// CHECK: dlopt.fused_elementwise(%{{.+}}) attributes {dlopt.layer = 0 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK: dlopt.cast
// CHECK: dlopt.fused_elementwise(%{{.+}}) attributes {dlopt.layer = 1 : i64} : (tensor<4xbf16>) -> tensor<4xbf16>
func.func @marks(%x: tensor<4xf32>) -> tensor<4xbf16> {
  %0 = dlopt.exp %x {dlopt.layer = 0} : tensor<4xf32>
  %1 = dlopt.cast %0 {dlopt.layer = 0} : tensor<4xf32> -> tensor<4xbf16>
  %2 = dlopt.tanh %1 {dlopt.layer = 1} : tensor<4xbf16>
  %3 = dlopt.gelu %2 {dlopt.layer = 1, approximate = "tanh"} : tensor<4xbf16>
  return %3 : tensor<4xbf16>
}

// -----

// Two producer groups joined by a consumer become one group.
// CHECK-LABEL: func @join
// CHECK: dlopt.fused_elementwise
// CHECK-NOT: dlopt.fused_elementwise
// CHECK: return
func.func @join(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %0 = dlopt.exp %x : tensor<4xf32>
  %1 = dlopt.log %0 : tensor<4xf32>
  %2 = dlopt.sqrt %y : tensor<4xf32>
  %3 = dlopt.abs %2 : tensor<4xf32>
  %4 = dlopt.maximum %1, %3 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %4 : tensor<4xf32>
}

// -----

// ReLU's gradient: the compare joins the select that reads its i1 result,
// so the i1 value lives only inside the group; the zero constant is shared.
// CHECK-LABEL: func @relu_grad
// CHECK-SAME: (%[[Y:.+]]: tensor<4x8xf32>, %[[DY:.+]]: tensor<4x8xf32>)
// CHECK-NEXT: %[[R:.+]] = dlopt.fused_elementwise(%[[Y]], %[[DY]]) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32> {
// CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<4x8xf32>, %[[B:.+]]: tensor<4x8xf32>):
// CHECK-NEXT: %[[Z:.+]] = arith.constant dense<0.000000e+00> : tensor<f32>
// CHECK-NEXT: %[[P:.+]] = dlopt.compare gt, %[[A]], %[[Z]] : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xi1>
// CHECK-NEXT: %[[S:.+]] = dlopt.select %[[P]], %[[B]], %[[Z]] : tensor<4x8xi1>, tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
// CHECK-NEXT: dlopt.yield %[[S]] : tensor<4x8xf32>
// CHECK: return %[[R]]
func.func @relu_grad(%y: tensor<4x8xf32>, %dy: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %z = arith.constant dense<0.0> : tensor<f32>
  %p = dlopt.compare gt, %y, %z : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xi1>
  %s = dlopt.select %p, %dy, %z : tensor<4x8xi1>, tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  return %s : tensor<4x8xf32>
}

// -----

// A chain through a compare: the compare cannot join the exp's group alone
// (its i1 result would leave it), but the select brings both in.
// CHECK-LABEL: func @through_compare
// CHECK-NEXT: %[[R:.+]] = dlopt.fused_elementwise
// CHECK: dlopt.exp
// CHECK-NEXT: dlopt.compare lt
// CHECK-NEXT: dlopt.select
// CHECK-NEXT: dlopt.add
// CHECK-NEXT: dlopt.yield
// CHECK-NOT: dlopt.compare
// CHECK: return %[[R]]
func.func @through_compare(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %e = dlopt.exp %x : tensor<4xf32>
  %p = dlopt.compare lt, %e, %y : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  %s = dlopt.select %p, %e, %y : tensor<4xi1>, tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %a = dlopt.add %s, %x : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %a : tensor<4xf32>
}

// -----

// i1 values never cross a group's border: a compare also read outside the
// group (returned), a select of an i1 argument, and a compare of integers
// stay unfused.
// CHECK-LABEL: func @bool_borders
// CHECK-NOT: dlopt.fused_elementwise
// CHECK: return
func.func @bool_borders(%x: tensor<4xf32>, %c: tensor<4xi1>, %i: tensor<4xi32>) -> (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) {
  %z = arith.constant dense<0.0> : tensor<f32>
  %p = dlopt.compare gt, %x, %z : tensor<4xf32>, tensor<f32> -> tensor<4xi1>
  %s = dlopt.select %p, %x, %z : tensor<4xi1>, tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %t = dlopt.select %c, %x, %z : tensor<4xi1>, tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %q = dlopt.compare eq, %i, %i : tensor<4xi32>, tensor<4xi32> -> tensor<4xi1>
  %u = dlopt.select %q, %t, %s : tensor<4xi1>, tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %p, %s, %u : tensor<4xi1>, tensor<4xf32>, tensor<4xf32>
}
