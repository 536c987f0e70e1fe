// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-optimizer="zero=1" --verify-diagnostics
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=tp sizes=2" --dlopt-optimizer="zero=2" 2>&1 | FileCheck %s --check-prefix=TP
// RUN: not dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="zero=4" 2>&1 | FileCheck %s --check-prefix=STAGE

// ZeRO needs data-parallel replicas to shard over.
// expected-error @+1 {{dlopt-optimizer: zero=1: ZeRO shards over the data-parallel replicas (mesh axes dp and cp), but the step is not partitioned (no dlopt.mesh)}}
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %l = dlopt.sum %h dims = [0, 1] : tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// TP: error: dlopt-optimizer: zero=2: ZeRO shards over the data-parallel replicas (mesh axes dp and cp), but the step's mesh has neither
// STAGE: error: dlopt-optimizer: zero=4: expects a ZeRO stage from 0 to 3
