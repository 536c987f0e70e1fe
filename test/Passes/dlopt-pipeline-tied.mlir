// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=sgd accumulate=3" --dlopt-pipeline="stages=2 schedule=1f1b micro-batches=3" | FileCheck %s

// A parameter read on both stages (a tied embedding): it lives on both,
// each stage sums its own gradient terms over the three micro-batches, one
// gradient crosses after them (not one per micro-batch), the update runs on
// the first stage and the updated parameter goes back to the second.
// CHECK-LABEL: func.func @main.stage0(
// CHECK-SAME: dlopt.param = "w"
// CHECK-NOT: dlopt.send_recv {{.*}}tensor<8x8xf32>
// CHECK: %[[G1:.+]] = dlopt.send_recv to [] from [1] over "pp" : () -> tensor<8x8xf32>
// CHECK: dlopt.add {{.*}}%[[G1]]{{.*}} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK: %[[W:.+]] = dlopt.sub %{{.+}}, %{{.+}} : tensor<8x8xf32>
// CHECK: dlopt.send_recv %[[W]] to [1] from [] over "pp" : (tensor<8x8xf32>) -> ()
// CHECK-NOT: dlopt.send_recv {{.*}}tensor<8x8xf32>
// CHECK: return
// CHECK-LABEL: func.func @main.stage1(
// CHECK-SAME: dlopt.param = "w"
// CHECK-NOT: dlopt.send_recv {{.*}}tensor<8x8xf32>
// CHECK: dlopt.send_recv %{{.+}} to [0] from [] over "pp" : (tensor<8x8xf32>) -> ()
// CHECK: %[[NEW:.+]] = dlopt.send_recv to [] from [0] over "pp" : () -> tensor<8x8xf32>
// CHECK: return %{{.+}}, %[[NEW]],
func.func @main(%x: tensor<4x8xf32> {dlopt.input = "x"},
                %w: tensor<8x8xf32> {dlopt.param = "w"}) -> tensor<f32>
    attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w {dlopt.id = 0 : i64, dlopt.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %r = dlopt.tanh %h {dlopt.id = 1 : i64, dlopt.stage = 0 : i64} : tensor<4x8xf32>
  %y = dlopt.matmul %r, %w {dlopt.id = 2 : i64, dlopt.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %l = dlopt.mean %y dims = [0, 1] {dlopt.id = 3 : i64, dlopt.stage = 1 : i64} : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
