// RUN: dlopt-opt %s --split-input-file --canonicalize | FileCheck %s

// CHECK-LABEL: func @reshape_chain
// CHECK-SAME: (%[[X:.+]]: tensor<4x6xf32>)
// CHECK-NEXT: %[[R:.+]] = dlopt.reshape %[[X]] : tensor<4x6xf32> -> tensor<24xf32>
// CHECK-NEXT: return %[[R]]
func.func @reshape_chain(%x: tensor<4x6xf32>) -> tensor<24xf32> {
  %0 = dlopt.reshape %x : tensor<4x6xf32> -> tensor<2x12xf32>
  %1 = dlopt.reshape %0 : tensor<2x12xf32> -> tensor<24xf32>
  return %1 : tensor<24xf32>
}

// -----

// CHECK-LABEL: func @identities
// CHECK-SAME: (%[[X:.+]]: tensor<4x6xf32>)
// CHECK-NEXT: return %[[X]]
func.func @identities(%x: tensor<4x6xf32>) -> tensor<4x6xf32> {
  %0 = dlopt.reshape %x : tensor<4x6xf32> -> tensor<4x6xf32>
  %1 = dlopt.transpose %0 perm = [0, 1] : tensor<4x6xf32> -> tensor<4x6xf32>
  %2 = dlopt.broadcast_to %1 : tensor<4x6xf32> -> tensor<4x6xf32>
  %3 = dlopt.cast %2 : tensor<4x6xf32> -> tensor<4x6xf32>
  %4 = dlopt.slice %3 start = [0, 0] limit = [4, 6] stride = [1, 1] : tensor<4x6xf32> -> tensor<4x6xf32>
  %5 = dlopt.concat %4 dim = 1 : tensor<4x6xf32> -> tensor<4x6xf32>
  %6 = dlopt.neg %5 : tensor<4x6xf32>
  %7 = dlopt.neg %6 : tensor<4x6xf32>
  %8 = dlopt.dropout %7 {rate = 0.0, seed = 3} : tensor<4x6xf32>
  %9 = dlopt.sum %8 dims = [] : tensor<4x6xf32> -> tensor<4x6xf32>
  %10 = dlopt.maximum %9, %9 : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
  return %10 : tensor<4x6xf32>
}

// -----

// CHECK-LABEL: func @transpose_compose
// CHECK-SAME: (%[[X:.+]]: tensor<2x3x4xf32>)
// CHECK-NEXT: %[[T:.+]] = dlopt.transpose %[[X]] perm = [2, 0, 1] : tensor<2x3x4xf32> -> tensor<4x2x3xf32>
// CHECK-NEXT: return %[[T]]
func.func @transpose_compose(%x: tensor<2x3x4xf32>) -> tensor<4x2x3xf32> {
  %0 = dlopt.transpose %x perm = [1, 2, 0] : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
  %1 = dlopt.transpose %0 perm = [1, 2, 0] : tensor<3x4x2xf32> -> tensor<4x2x3xf32>
  return %1 : tensor<4x2x3xf32>
}

// -----

// CHECK-LABEL: func @arith_identities
// CHECK-SAME: (%[[X:.+]]: tensor<4xf32>)
// CHECK-NEXT: return %[[X]]
func.func @arith_identities(%x: tensor<4xf32>) -> tensor<4xf32> {
  %zero = arith.constant dense<0.0> : tensor<4xf32>
  %one = arith.constant dense<1.0> : tensor<4xf32>
  %0 = dlopt.add %x, %zero : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %1 = dlopt.add %zero, %0 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %2 = dlopt.sub %1, %zero : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %3 = dlopt.mul %2, %one : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %4 = dlopt.div %3, %one : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %4 : tensor<4xf32>
}

// -----

// A broadcasting add with zero changes the shape, so it must stay.
// CHECK-LABEL: func @no_fold_broadcast
// CHECK: dlopt.add
func.func @no_fold_broadcast(%x: tensor<4xf32>) -> tensor<3x4xf32> {
  %zero = arith.constant dense<0.0> : tensor<3x4xf32>
  %0 = dlopt.add %x, %zero : tensor<4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// -----

// CHECK-LABEL: func @constant_fold
// CHECK-NEXT: %[[C:.+]] = arith.constant dense<[5.000000e+00, -3.000000e+00]> : tensor<2xf32>
// CHECK-NEXT: %[[I:.+]] = arith.constant dense<-12> : tensor<3xi32>
// CHECK-NEXT: return %[[C]], %[[I]]
func.func @constant_fold() -> (tensor<2xf32>, tensor<3xi32>) {
  %a = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %b = arith.constant dense<[4.0, -5.0]> : tensor<2xf32>
  %0 = dlopt.add %a, %b : tensor<2xf32>, tensor<2xf32> -> tensor<2xf32>
  %i = arith.constant dense<3> : tensor<3xi32>
  %j = arith.constant dense<4> : tensor<3xi32>
  %1 = dlopt.mul %i, %j : tensor<3xi32>, tensor<3xi32> -> tensor<3xi32>
  %2 = dlopt.neg %1 : tensor<3xi32>
  return %0, %2 : tensor<2xf32>, tensor<3xi32>
}

// -----

// Integer division is never folded: the runtime reports division by zero.
// CHECK-LABEL: func @int_div_kept
// CHECK: dlopt.div
func.func @int_div_kept() -> tensor<2xi32> {
  %a = arith.constant dense<4> : tensor<2xi32>
  %z = arith.constant dense<0> : tensor<2xi32>
  %0 = dlopt.div %a, %z : tensor<2xi32>, tensor<2xi32> -> tensor<2xi32>
  return %0 : tensor<2xi32>
}

// -----

// CHECK-LABEL: func @reshape_constant
// CHECK-NEXT: %[[C:.+]] = arith.constant dense<{{\[}}[1, 2], [3, 4]]> : tensor<2x2xi64>
// CHECK-NEXT: return %[[C]]
func.func @reshape_constant() -> tensor<2x2xi64> {
  %a = arith.constant dense<[1, 2, 3, 4]> : tensor<4xi64>
  %0 = dlopt.reshape %a : tensor<4xi64> -> tensor<2x2xi64>
  return %0 : tensor<2x2xi64>
}

// -----

// Dead pure ops disappear; layer marks survive on what stays.
// CHECK-LABEL: func @dead_code
// CHECK-NEXT: %[[E:.+]] = dlopt.exp %{{.+}} {dlopt.layer = 2 : i64}
// CHECK-NEXT: return %[[E]]
func.func @dead_code(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = dlopt.tanh %x : tensor<4xf32>
  %1 = dlopt.exp %x {dlopt.layer = 2} : tensor<4xf32>
  return %1 : tensor<4xf32>
}
