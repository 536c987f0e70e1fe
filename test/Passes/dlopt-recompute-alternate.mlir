// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd zero=3" --dlopt-recompute="policy=alternate" | FileCheck %s
// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd zero=3" --dlopt-recompute="policy=elementwise" | FileCheck %s --check-prefix=EW

// Alternate recomputation of a ZeRO-3 step: before the layer's backward
// pass the norm and, of the layer's five matmuls, the second (w2) and the
// fourth (w4) run again, with the activations between them; the first,
// third and fifth keep their results (the fifth's is read by no backward
// op). The layer's bucket of parameters is gathered again for them and the
// backward pass reads that gather: no third gather, and the forward's
// gather is not held until the backward pass.
// CHECK-LABEL: func.func @main
// CHECK: %[[M1:.+]] = dlopt.matmul %{{.+}}, %{{.+}} {dlopt.layer = 0 : i64}
// CHECK-NEXT: dlopt.matmul
// CHECK-NEXT: dlopt.mul
// CHECK-NEXT: %[[M3:.+]] = dlopt.matmul %{{.+}}, %{{.+}} {dlopt.layer = 0 : i64}
// CHECK: %[[AG:.+]] = shard.all_gather %{{.+}} {dlopt.layer = 0 : i64, dlopt.recompute, dlopt.zero_gather = "fwd"}
// CHECK: %[[N:.+]] = dlopt.rms_norm %{{.+}} {axis = 1 : i64, dlopt.layer = 0 : i64, dlopt.recompute
// CHECK-NEXT: %[[M2:.+]] = dlopt.matmul %[[N]], %{{.+}} {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NEXT: %[[P:.+]] = dlopt.mul %[[M1]], %[[M2]] {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NEXT: %[[A3:.+]] = dlopt.tanh %[[M3]] {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NEXT: %[[M4:.+]] = dlopt.matmul %[[A3]], %{{.+}} {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NEXT: %[[A4:.+]] = dlopt.tanh %[[M4]] {dlopt.layer = 0 : i64, dlopt.recompute}
// CHECK-NOT: dlopt.recompute
// CHECK-NOT: all_gather {{.*}}zero_gather = "bwd"
// CHECK-DAG: dlopt.matmul %[[A4]], %{{.+}} {dlopt.backward, dlopt.layer = 0 : i64, transpose_a}
// CHECK-DAG: dlopt.matmul %[[P]], %{{.+}} {dlopt.backward, dlopt.layer = 0 : i64, transpose_a}
// CHECK: return

// Elementwise recomputation re-runs no matmul, but the norm's weight comes
// from the bucket gathered again too, not from the forward's gather.
// EW-LABEL: func.func @main
// EW: dlopt.matmul %{{.+}}, %{{.+}} {dlopt.layer = 0 : i64}
// EW-NEXT: %[[M2:.+]] = dlopt.matmul %{{.+}}, %{{.+}} {dlopt.layer = 0 : i64}
// EW: shard.all_gather %{{.+}} {dlopt.layer = 0 : i64, dlopt.recompute, dlopt.zero_gather = "fwd"}
// EW: dlopt.rms_norm %{{.+}} {axis = 1 : i64, dlopt.layer = 0 : i64, dlopt.recompute
// EW: dlopt.mul %{{.+}}, %[[M2]] {dlopt.layer = 0 : i64, dlopt.recompute}
// EW-NOT: dlopt.matmul {{.*}}dlopt.recompute
// EW-NOT: all_gather {{.*}}zero_gather = "bwd"
// EW: return
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %g: tensor<4xf32> {dlopt.param = "g"},
                %w1: tensor<4x4xf32> {dlopt.param = "w1"},
                %w2: tensor<4x4xf32> {dlopt.param = "w2"},
                %w3: tensor<4x4xf32> {dlopt.param = "w3"},
                %w4: tensor<4x4xf32> {dlopt.param = "w4"},
                %w5: tensor<4x4xf32> {dlopt.param = "w5"},
                %t: tensor<8x4xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %n = dlopt.rms_norm %x weight(%g) {axis = 1, eps = 1.0e-5, dlopt.layer = 0 : i64} : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %m1 = dlopt.matmul %n, %w1 {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %m2 = dlopt.matmul %n, %w2 {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %p = dlopt.mul %m1, %m2 {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<8x4xf32> -> tensor<8x4xf32>
  %m3 = dlopt.matmul %p, %w3 {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %a3 = dlopt.tanh %m3 {dlopt.layer = 0 : i64} : tensor<8x4xf32>
  %m4 = dlopt.matmul %a3, %w4 {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %a4 = dlopt.tanh %m4 {dlopt.layer = 0 : i64} : tensor<8x4xf32>
  %m5 = dlopt.matmul %a4, %w5 {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %r = dlopt.add %x, %m5 {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<8x4xf32> -> tensor<8x4xf32>
  %l = dlopt.mse %r, %t : tensor<8x4xf32>, tensor<8x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
