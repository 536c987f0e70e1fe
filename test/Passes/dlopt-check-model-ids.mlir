// Stable op ids: dlopt-check-model stamps `dlopt.id` on every op of the
// entry function in program order; the training transforms keep them and
// record the forward op each derived op comes from (`dlopt.fwd_id`).
// RUN: dlopt-opt %s --split-input-file --dlopt-check-model | FileCheck %s --check-prefix=STAMP
// RUN: dlopt-opt %s --split-input-file --dlopt-check-model --dlopt-check-model | FileCheck %s --check-prefix=STAMP
// RUN: dlopt-opt %s --split-input-file --dlopt-compile-pipeline="train=true fuse-elementwise=false" | FileCheck %s --check-prefix=TRAIN
// RUN: dlopt-opt %s --split-input-file --dlopt-compile-pipeline="train=true fuse-elementwise=false recompute=full" | FileCheck %s --check-prefix=RECOMPUTE
// RUN: dlopt-opt %s --split-input-file --dlopt-compile-pipeline="train=true fuse-elementwise=false precision=bf16" | FileCheck %s --check-prefix=CAST
// RUN: dlopt-opt %s --split-input-file --dlopt-check-model --dlopt-autodiff --dlopt-optimizer=accumulate=2 | FileCheck %s --check-prefix=ACC

// STAMP-LABEL: func @main
// STAMP: dlopt.matmul {{.*}}{dlopt.id = 0 : i64, dlopt.layer = 0 : i64}
// STAMP: dlopt.relu {{.*}}{dlopt.id = 1 : i64, dlopt.layer = 0 : i64}
// STAMP: dlopt.mse {{.*}}{dlopt.id = 2 : i64}
// STAMP-NOT: dlopt.id = 3

// The forward ops keep their ids through autodiff and the optimizer; the
// backward ops of op N carry dlopt.fwd_id = N and no id of their own.
// TRAIN-LABEL: func @main
// TRAIN-DAG: dlopt.matmul %{{.*}}, %{{.*}} {dlopt.id = 0 : i64, dlopt.layer = 0 : i64}
// TRAIN-DAG: dlopt.relu %{{.*}} {dlopt.id = 1 : i64, dlopt.layer = 0 : i64}
// TRAIN-DAG: dlopt.sub {{.*}}{dlopt.backward, dlopt.fwd_id = 2 : i64}
// TRAIN-DAG: dlopt.select {{.*}}{dlopt.backward, dlopt.fwd_id = 1 : i64, dlopt.layer = 0 : i64}
// TRAIN-DAG: dlopt.matmul {{.*}}{dlopt.backward, dlopt.fwd_id = 0 : i64, dlopt.layer = 0 : i64, transpose_a}
// TRAIN-NOT: dlopt.backward, dlopt.id

// Recomputed clones record the op they copy; bf16 casts the op whose
// result they convert.
// RECOMPUTE-LABEL: func @main
// RECOMPUTE: dlopt.relu {{.*}}{dlopt.fwd_id = 1 : i64, dlopt.layer = 0 : i64, dlopt.recompute}
// CAST-LABEL: func @main
// CAST: dlopt.cast {{.*}}{dlopt.fwd_id = 1 : i64, dlopt.layer = 0 : i64}

// Micro-batch replays keep the ids and add dlopt.mb, so (id, mb) is unique.
// ACC-LABEL: func @main
// ACC-DAG: dlopt.matmul {{.*}}{dlopt.id = 0 : i64, dlopt.layer = 0 : i64, dlopt.mb = 0 : i64}
// ACC-DAG: dlopt.matmul {{.*}}{dlopt.id = 0 : i64, dlopt.layer = 0 : i64, dlopt.mb = 1 : i64}
func.func @main(%x: tensor<4x8xf32> {dlopt.input = "x"},
                %y: tensor<4x8xf32> {dlopt.input = "y"},
                %w: tensor<8x8xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w {dlopt.layer = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a = dlopt.relu %h {dlopt.layer = 0 : i64} : tensor<4x8xf32>
  %l = dlopt.mse %a, %y : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
