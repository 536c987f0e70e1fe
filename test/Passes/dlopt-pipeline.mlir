// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=sgd accumulate=2" --dlopt-pipeline="stages=2 schedule=1f1b micro-batches=2" | FileCheck %s
// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=sgd accumulate=2" --dlopt-pipeline="stages=2 schedule=gpipe micro-batches=2" | FileCheck %s --check-prefix=GPIPE
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=sgd accumulate=2" --dlopt-pipeline="stages=2 schedule=round-robin micro-batches=2" 2>&1 | FileCheck %s --check-prefix=BADSCHED
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-optimizer="optimizer=sgd accumulate=2" --dlopt-pipeline="stages=3 micro-batches=2" 2>&1 | FileCheck %s --check-prefix=CHUNKS
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-pipeline="stages=2" 2>&1 | FileCheck %s --check-prefix=NOSTEP

// Two stages, two micro-batches, 1F1B. Stage 0 runs F0 F1 B0 B1: its
// activations go to stage 1 right after each forward, the input gradients
// come back before each backward. Stage 1 runs F0 B0 F1 B1. The step counter
// and the learning rate live on both stages; stage 1's gradient-norm term
// crosses to stage 0 after the micro-batches, in program order.
// CHECK: module attributes {dlopt.mesh = {axes = ["pp"], shape = array<i64: 2>}}
// CHECK-LABEL: func.func @main.stage0(
// CHECK-SAME: dlopt.param = "w0"
// CHECK-NOT: dlopt.param = "w1"
// CHECK: %[[A0:.+]] = dlopt.tanh {{.+}}dlopt.mb = 0
// CHECK-NEXT: dlopt.send_recv %[[A0]] to [1] from [] over "pp" : (tensor<4x8xf32>) -> ()
// CHECK: %[[A1:.+]] = dlopt.tanh {{.+}}dlopt.mb = 1
// CHECK-NEXT: dlopt.send_recv %[[A1]] to [1] from [] over "pp"
// CHECK-NEXT: %[[G0:.+]] = dlopt.send_recv to [] from [1] over "pp" : () -> tensor<4x8xf32>
// CHECK: dlopt.mul %[[G0]], {{.+}}dlopt.mb = 0
// CHECK: %[[G1:.+]] = dlopt.send_recv to [] from [1] over "pp" : () -> tensor<4x8xf32>
// CHECK: dlopt.mul %[[G1]], {{.+}}dlopt.mb = 1
// CHECK: %[[N1:.+]] = dlopt.send_recv to [] from [1] over "pp" : () -> tensor<f32>
// CHECK: dlopt.add %{{.+}}, %[[N1]]
// CHECK: return
// CHECK-LABEL: func.func @main.stage1(
// CHECK-SAME: dlopt.param = "w1"
// CHECK: %[[X0:.+]] = dlopt.send_recv to [] from [0] over "pp" : () -> tensor<4x8xf32>
// CHECK: dlopt.matmul %[[X0]], {{.+}}dlopt.mb = 0
// CHECK: %[[X1:.+]] = dlopt.send_recv to [] from [0] over "pp" : () -> tensor<4x8xf32>
// CHECK: %[[D0:.+]] = dlopt.matmul {{.+}}dlopt.backward, dlopt.fwd_id = 2 : i64, dlopt.mb = 0 : i64, transpose_b
// CHECK: dlopt.send_recv %[[D0]] to [0] from [] over "pp"
// CHECK: dlopt.matmul %[[X1]], {{.+}}dlopt.mb = 1
// CHECK: %[[D1:.+]] = dlopt.matmul {{.+}}dlopt.backward, dlopt.fwd_id = 2 : i64, dlopt.mb = 1 : i64, transpose_b
// CHECK: dlopt.send_recv %[[D1]] to [0] from [] over "pp"
// CHECK: dlopt.send_recv %{{.+}} to [0] from [] over "pp" : (tensor<f32>) -> ()
// CHECK: return

// GPipe: stage 1 runs both forwards before either backward.
// GPIPE-LABEL: func.func @main.stage1(
// GPIPE: dlopt.matmul {{.+}}dlopt.id = 2 : i64, dlopt.mb = 0
// GPIPE: dlopt.matmul {{.+}}dlopt.id = 2 : i64, dlopt.mb = 1
// GPIPE: dlopt.backward, dlopt.fwd_id = 2 : i64, dlopt.mb = 0

// BADSCHED: dlopt-pipeline: unknown schedule 'round-robin'; expected gpipe, 1f1b, interleaved-1f1b or zero-bubble
// CHUNKS: dlopt-pipeline: the forward ops form 2 model chunk(s) over the stages; expected stages x virtual-stages = 3
// NOSTEP: dlopt-pipeline: expects a training step (after dlopt-optimizer)
func.func @main(%x: tensor<4x8xf32> {dlopt.input = "x"},
                %w0: tensor<8x8xf32> {dlopt.param = "w0"},
                %w1: tensor<8x2xf32> {dlopt.param = "w1"}) -> tensor<f32>
    attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w0 {dlopt.id = 0 : i64, dlopt.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %r = dlopt.tanh %h {dlopt.id = 1 : i64, dlopt.stage = 0 : i64} : tensor<4x8xf32>
  %y = dlopt.matmul %r, %w1 {dlopt.id = 2 : i64, dlopt.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  %l = dlopt.mean %y dims = [0, 1] {dlopt.id = 3 : i64, dlopt.stage = 1 : i64} : tensor<4x2xf32> -> tensor<f32>
  return %l : tensor<f32>
}
